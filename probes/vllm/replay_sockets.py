"""The KV-event tap's replay sockets: one ZMQ DEALER per data-parallel rank to vLLM's replay
ROUTER (its ``--kv-events-config`` ``replay_endpoint``), made when that rank's first gap is
asked about and polled beside the live socket; dropped when a replay times out, so late
answers cannot end the next replay."""

from __future__ import annotations


class ReplaySockets:
    """The replay sockets of one tap, registered with its ``poller`` while they live."""

    def __init__(self, context, poller, max_message_bytes: int):
        self._context, self._poller, self._max_message_bytes = context, poller, max_message_bytes
        self._by_rank: dict[int, object] = {}

    def rank_of(self, sock) -> int | None:
        """The rank whose replay socket ``sock`` is; ``None`` for any other socket."""
        for rank, replay in self._by_rank.items():
            if replay is sock:
                return rank
        return None

    def socket(self, rank: int, endpoint: str):
        """Rank ``rank``'s socket, connected to ``endpoint`` when first asked for."""
        import zmq

        sock = self._by_rank.get(rank)
        if sock is None:
            sock = self._context.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.MAXMSGSIZE, self._max_message_bytes)
            sock.connect(endpoint)
            self._poller.register(sock, zmq.POLLIN)
            self._by_rank[rank] = sock
        return sock

    def drop(self, rank: int) -> None:
        sock = self._by_rank.pop(rank, None)
        if sock is not None:
            self._poller.unregister(sock)
            sock.close(linger=0)

    def close(self) -> None:
        for sock in self._by_rank.values():
            sock.close(linger=0)
        self._by_rank.clear()
