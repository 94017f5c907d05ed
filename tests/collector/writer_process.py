"""A writer process for the crash and lock tests: ingests numbered batches into a store.

    python writer_process.py STORE --batches N [--rows R] [--segments DIR] [--hold-s S]

Batch k has source "crash-test", sequence k and R block events whose hashes encode (k, i).
After each commit it prints "ACK k" (flushed), so the parent knows what was acknowledged.
With --segments it exports segments after every batch; with --hold-s it keeps the store
open (and its lock held) that long after the last batch, printing "HOLDING".
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from kvtier.collector.batch import EventBatch  # noqa: E402
from kvtier.collector.events import BlockEvent, Origin, Outcome, RequestRecord  # noqa: E402
from kvtier.collector.segments import export_segments  # noqa: E402
from kvtier.collector.store import TraceStore  # noqa: E402

ORIGIN = Origin("reference", "node-1", "crash-test")


def batch(k: int, rows: int) -> EventBatch:
    events = [BlockEvent(1_800_000_000.0 + k, Outcome.GPU_HIT, k << 32 | i, request_id=f"r{k}", position=i)
              for i in range(rows)]
    return EventBatch.from_rows(ORIGIN, k, events, [RequestRecord(f"r{k}", 1_800_000_000.0 + k, rows * 16)])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("store")
    parser.add_argument("--batches", type=int, required=True)
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--segments")
    parser.add_argument("--hold-s", type=float, default=0.0)
    args = parser.parse_args()
    store = TraceStore(args.store)
    for k in range(args.batches):
        result = store.ingest(batch(k, args.rows))
        if args.segments:
            export_segments(store, args.segments)
        print(f"{'DUP' if result.duplicate else 'ACK'} {k}", flush=True)
    if args.hold_s:
        print("HOLDING", flush=True)
        time.sleep(args.hold_s)
    store.close()


if __name__ == "__main__":
    main()
