"""A tap for vLLM's data-parallel publishers started from one ``--kv-events-config``: each rank
publishes on the endpoint offset by its rank (``kvtier collect`` takes the endpoints one by one;
``test_tap_real`` checks this rule against vLLM's own publishers)."""

from __future__ import annotations

from kvtier.probes.vllm.tap_config import VllmTapConfig


def offset_endpoint(endpoint: str, rank: int) -> str:
    """vLLM's per-dp-rank endpoint (``ZmqEventPublisher.offset_endpoint_port``): a TCP port
    plus the rank (port 0 unchanged), an ``inproc``/``ipc`` name with ``_dp{rank}``."""
    if rank == 0:
        return endpoint
    if endpoint.startswith(("inproc://", "ipc://")):
        return f"{endpoint}_dp{rank}"
    head, _, port = endpoint.rpartition(":")
    if not port.isdigit():
        raise ValueError(f"endpoint {endpoint!r} has no numeric port to offset")
    return endpoint if port == "0" else f"{head}:{int(port) + rank}"


def for_data_parallel(endpoint: str, replay_endpoint: str | None, ranks: int,
                      **options) -> VllmTapConfig:
    """A tap for ``ranks`` data-parallel publishers started from one ``--kv-events-config``."""
    if not isinstance(ranks, int) or ranks < 1:
        raise ValueError(f"ranks must be an int >= 1, got {ranks!r}")
    endpoints = tuple(offset_endpoint(endpoint, r) for r in range(ranks))
    replays = () if replay_endpoint is None else tuple(
        (r, offset_endpoint(replay_endpoint, r)) for r in range(ranks))
    return VllmTapConfig(endpoints=endpoints, replay_endpoints=replays, **options)
