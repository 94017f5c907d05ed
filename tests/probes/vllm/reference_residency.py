"""The residency rule in plain Python: the oracle the compiled stream columns are checked
against (``probes/vllm/wire_columns.pyx``)."""

from __future__ import annotations

from kvtier.collector.events import Outcome, Tier


def apply_residency(resident: set, decoded, max_tracked: int) -> list[dict]:
    """The decoded rows, with each ``AllBlocksCleared`` turned into one GPU evict per block
    in ``resident`` (the GPU-resident hashes, updated in place; at most ``max_tracked``)."""
    clears = dict(decoded.cleared)
    out: list[dict] = []
    for i, event in enumerate(decoded.events + (None,)):
        if i in clears:
            out.extend({"time_s": decoded.ts_s, "kind": Outcome.EVICT, "block_hash": h,
                        "tier_from": Tier.GPU} for h in sorted(resident))
            resident.clear()
        if event is None:
            break
        out.append(event)
        kind = event["kind"]
        if kind is Outcome.STORE and event["tier_to"] is Tier.GPU:
            if len(resident) < max_tracked:
                resident.add(event["block_hash"])
        elif kind is Outcome.EVICT and event["tier_from"] is Tier.GPU:
            resident.discard(event["block_hash"])
    return out
