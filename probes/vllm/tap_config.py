"""Configuration and counters of the vLLM KV-event tap (:mod:`kvtier.probes.vllm.tap`)."""

from __future__ import annotations

from dataclasses import dataclass

_ALL_INTERFACES = ("*", "0.0.0.0", "[::]", "::")


@dataclass(frozen=True)
class VllmTapConfig:
    """Where and how to listen. ``replay_endpoints`` maps a dp rank to its ROUTER socket.

    ``bind`` makes the tap bind ``endpoints`` (vLLM connects to it); binding all interfaces
    needs ``allow_all_interfaces``. ``heal_from_zero`` asks the replay socket for the
    sequences before the first one seen (a tap that joins late, or ZMQ's slow-joiner loss).
    ``coalesce_frames`` hands over one batch per stream per :meth:`poll` instead of one per
    vLLM batch (the store pays a fixed cost per batch, and DuckDB writes batches of at least a
    row group, 122,880 rows, straight to the file; up to ``max_rows_per_batch`` rows).
    ``receive_hwm`` is the SUB socket's queue in frames: ZMQ drops frames silently once it is
    full, so it absorbs the frames that arrive while a batch is committed.
    ``fast_decode`` decodes payloads with the compiled walker and leaves only frames it is not
    sure of to the general decoder; off, every frame takes the general decoder (a baseline).
    ``engine`` names the producer in the records: SGLang's ``--kv-events-config`` publishes
    the same wire format (without ``medium``, so every block reads as GPU).
    ``connect_grace_s``: a tap that connects (``bind`` off) counts an endpoint as failed when it
    has no working ZMQ connection this long after the tap opened (ZMQ's handshake interval).
    """

    endpoints: tuple[str, ...] = ("tcp://127.0.0.1:5557",)
    bind: bool = False
    replay_endpoints: tuple[tuple[int, str], ...] = ()
    topic: str = ""
    instance: str = "vllm"
    engine: str = "vllm"
    coalesce_frames: bool = False
    max_rows_per_batch: int = 250_000
    receive_hwm: int = 10_000
    fast_decode: bool = True
    heal_from_zero: bool = False
    replay_timeout_s: float = 2.0
    max_message_bytes: int = 64 << 20
    max_tracked_blocks: int = 1_000_000
    allow_all_interfaces: bool = False
    connect_grace_s: float = 5.0

    def __post_init__(self) -> None:
        if not self.endpoints:
            raise ValueError("endpoints must name at least one ZMQ endpoint")
        for endpoint in self.endpoints + tuple(e for _, e in self.replay_endpoints):
            if (not isinstance(endpoint, str) or "://" not in endpoint
                    or endpoint.split("://", 1)[0] not in ("tcp", "ipc", "inproc")):
                raise ValueError(f"bad ZMQ endpoint {endpoint!r}; expected tcp://HOST:PORT "
                                 "(e.g. tcp://127.0.0.1:5557), ipc://PATH or inproc://NAME")
        if self.bind and not self.allow_all_interfaces:
            for endpoint in self.endpoints:
                if _host(endpoint) in _ALL_INTERFACES:
                    raise ValueError(f"binding {endpoint!r} listens on all interfaces; "
                                     "use tcp://127.0.0.1:PORT or set allow_all_interfaces")
        ranks = [r for r, _ in self.replay_endpoints]
        if len(set(ranks)) != len(ranks) or any(not isinstance(r, int) or r < 0 for r in ranks):
            raise ValueError(f"replay_endpoints need distinct dp ranks >= 0, got {ranks}")
        for name in ("replay_timeout_s", "max_message_bytes", "max_tracked_blocks",
                     "max_rows_per_batch", "receive_hwm", "connect_grace_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")
        for name in ("instance", "engine"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise ValueError(f"{name} must be a non-empty string, got {getattr(self, name)!r}")


def _host(endpoint: str) -> str:
    rest = endpoint.split("://", 1)[1]
    return rest.rsplit(":", 1)[0] if ":" in rest else rest


@dataclass
class TapStats:
    """Counters since the tap started. ``batches`` counts vLLM batches (frames) decoded,
    ``ingest_batches`` the ``EventBatch``es handed over; ``lost_batches`` were missing and
    not replayable; ``bad_events`` were skipped inside good frames (by the decoder or the
    schema's checks); ``fallback_frames`` were decoded by the general decoder because the
    compiled walker was not sure of them (or ``fast_decode`` was off); ``resumed_streams``
    went on from a source the store already held (the collector restarted)."""

    batches: int = 0
    ingest_batches: int = 0
    block_events: int = 0
    bad_frames: int = 0
    bad_events: int = 0
    gaps: int = 0
    replay_requests: int = 0
    replayed_batches: int = 0
    replay_duplicates: int = 0
    replay_timeouts: int = 0
    lost_batches: int = 0
    restarts: int = 0
    callback_errors: int = 0
    fallback_frames: int = 0
    resumed_streams: int = 0
