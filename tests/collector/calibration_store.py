"""An engine's records for the calibration readers' tests, written to a real store.

Each instance serves its phases' requests one at a time: a request waits ``ADMIT_S``, one
step prefills what no tier held, one decode step per further output token follows; each step
costs the instance's ``StepCost`` exactly (the instances' costs differ, so a fit on the
wrong instance's steps shows). In a phase with a CPU tier a request's promoted blocks are one
load job: one event per block, each with the job's latency. Request ids repeat in every
phase and instance (as a replayed trace's do), so only the selection tells them apart.
:func:`hold` keeps stores locked from a second process, as a running collector does.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass

from kvtier.collector import columns
from kvtier.collector.batch import EventBatch
from kvtier.collector.events import BlockEvent, Origin, Outcome, RequestRecord, StepRecord, Tier
from kvtier.collector.store import TraceStore

BLOCK_TOKENS = 16
KV_BYTES_PER_TOKEN = 512
ADMIT_S = 0.001
START_S = 1_800_000_000.0


@dataclass(frozen=True)
class Phase:
    """``requests`` served with ``tier_config``; each promotes ``promoted_blocks`` blocks
    (0: a GPU-only phase) taking ``load_s`` a job."""

    tier_config: str
    requests: int
    promoted_blocks: int = 0
    load_s: float = 0.004


@dataclass(frozen=True)
class Serving:
    """One instance: its step cost (overhead, per prefill token, per decoding request) and
    the phases it served, one after another."""

    instance: str
    overhead_s: float
    prefill_token_s: float
    decode_request_s: float
    phases: tuple[Phase, ...]


def records(serving: Serving) -> tuple[list[RequestRecord], list[StepRecord], list[BlockEvent]]:
    """The instance's requests, steps and promotion events, its phases back to back."""
    requests, steps, events = [], [], []
    t = START_S
    for phase in serving.phases:
        for i in range(phase.requests):
            prompt, output = 64 + 16 * (i % 9), 2 + i % 5
            promoted = min(phase.promoted_blocks * BLOCK_TOKENS, prompt - BLOCK_TOKENS)
            hashes = tuple(1 + 1000 * i + b for b in range(-(-prompt // BLOCK_TOKENS)))
            arrival, t = t, t + ADMIT_S
            if promoted:
                blocks = promoted // BLOCK_TOKENS
                events += [BlockEvent(t, Outcome.CPU_PROMOTION, hashes[b], request_id=f"r{i}",
                                      position=b, size_bytes=BLOCK_TOKENS * KV_BYTES_PER_TOKEN,
                                      tier_from=Tier.CPU, tier_to=Tier.GPU, latency_s=phase.load_s)
                           for b in range(blocks)]
            work = [(prompt - promoted, 1, 0)] + [(0, 0, 1)] * (output - 1)
            ttft = None
            for tokens, prefills, decodes in work:
                duration = (serving.overhead_s + tokens * serving.prefill_token_s
                            + decodes * serving.decode_request_s)
                steps.append(StepRecord(t, len(steps), duration, tokens, prefills, 0,
                                        promoted if prefills else 0, decodes, decodes * prompt,
                                        running_requests=1,
                                        loaded_bytes=promoted * KV_BYTES_PER_TOKEN if prefills else 0))
                t += duration
                ttft = ttft if ttft is not None else t - arrival
            requests.append(RequestRecord(
                f"r{i}", arrival, prompt, output, hashes, BLOCK_TOKENS, gpu_hit_tokens=0,
                cpu_promotion_tokens=promoted, cold_promotion_tokens=0,
                recomputed_tokens=prompt - promoted, ttft_s=ttft, itl_s=(t - arrival - ttft) / max(output - 1, 1),
                e2e_latency_s=t - arrival, tier_config_id=phase.tier_config))
            t += 0.05  # the client thinks
        t += 5.0  # between phases
    return requests, steps, events


def write(path, *servings: Serving) -> None:
    """Write each instance's records into the store at ``path``, as its engine's batch."""
    with TraceStore(path) as store:
        for serving in servings:
            requests, steps, events = records(serving)
            step_table, rejected = columns.rows_to_table(StepRecord, steps)
            batch = EventBatch.from_rows(Origin("reference", serving.instance,
                                                f"{serving.instance}/engine"), 0, events, requests)
            assert not rejected and not batch.rejected
            store.ingest(EventBatch(batch.origin, 0, batch.block_events, batch.requests,
                                    batch.rejected, step_records=step_table))


def hold(*paths) -> subprocess.Popen:
    """A second process holding each store open for writing (DuckDB's lock)."""
    holder = subprocess.Popen([sys.executable, "-c", (
        "import duckdb, sys, time; held = [duckdb.connect(p) for p in sys.argv[1:]]; "
        "print('held', flush=True); time.sleep(120)"), *map(str, paths)],
        stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    return holder


A = Serving("node-a", 0.002, 2e-5, 3e-4, (Phase("gpu-only", 24), Phase("gpu+cpu", 24, promoted_blocks=3)))
B = Serving("node-b", 0.007, 7e-5, 9e-4, (Phase("gpu-only", 30),))
