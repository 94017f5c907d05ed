"""A fleet's segments from a trace (the bundled Mooncake one by default): its requests dealt round-robin to
``instances`` serving instances, each stored by its own collector store and exported into
one shared segment folder (the fleet recipe in README)."""

from __future__ import annotations

from pathlib import Path

from kvtier.collector.batch import EventBatch
from kvtier.collector.events import Origin
from kvtier.collector.segments import export_segments
from kvtier.collector.store import TraceStore
from kvtier.policy.readers import open_trace

MOONCAKE = Path(__file__).resolve().parents[2] / "kvtier" / "data" / "mooncake_conversation_trace.jsonl.gz"


def fleet_segments(root: Path, instances: tuple[str, ...] = ("node-a", "node-b"),
                   max_requests: int | None = None, chunk: int = 2000,
                   trace: Path = MOONCAKE) -> Path:
    """Write the segments under ``root / "segments"`` and return that folder."""
    records = list(open_trace(trace).requests())[:max_requests]
    segments = root / "segments"
    for k, name in enumerate(instances):
        mine = records[k::len(instances)]
        with TraceStore(root / f"{name}.duckdb") as store:
            origin = Origin("trace", name, f"mooncake:{name}")
            for seq, start in enumerate(range(0, len(mine), chunk)):
                store.ingest(EventBatch.from_rows(origin, seq, requests=mine[start:start + chunk]))
            export_segments(store, segments)
    return segments
