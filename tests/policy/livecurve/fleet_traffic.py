"""Traffic for the live-curve tests: a synthetic fleet's requests (prefix-chained hashes,
16-token blocks, shared system prompts and growing conversations), the batches a store
holds (rebuilt per batch, as the collector received them), and the offline replay the live
curve is held to."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from kvtier.collector.batch import EventBatch
from kvtier.collector.events import Origin, RequestRecord
from kvtier.collector.store import TraceStore
from kvtier.policy.sim.config import SimConfig
from kvtier.policy.sim.simulator import Simulator

BLOCK = 16
MASK = (1 << 64) - 1


def chained(parent: int, content: int) -> int:
    """A prefix-chained block hash (the block's own content and everything before it)."""
    return (parent * 0x9E3779B97F4A7C15 + content * 0xBF58476D1CE4E5B9 + 1) & MASK


MAX_BLOCKS = 48  # a prompt's blocks at most: every tier size the tests ask for holds one


def instance_requests(seed: int, requests: int, name: str) -> list[RequestRecord]:
    """One instance's traffic: conversations that grow turn by turn over one of three system
    prompts (a conversation near :data:`MAX_BLOCKS` ends), some prompts an exact multiple of
    the block size (vLLM then computes the last full block again), arrivals 0.5 s apart on
    average."""
    rng = np.random.default_rng(seed)
    systems = [[chained(0, 10_000 + s * 100 + i) for i in range(int(rng.integers(8, 24)))]
               for s in range(3)]
    sessions: list[list[int]] = []
    out, now = [], 0.0
    for i in range(requests):
        sessions = [chain for chain in sessions if len(chain) < MAX_BLOCKS - 12]
        if not sessions or rng.random() < 0.3:
            sessions.append(list(systems[int(rng.integers(0, 3))]))
        chain = sessions[int(rng.integers(0, len(sessions)))]
        for _ in range(int(rng.integers(1, 12))):  # the new turn
            chain.append(chained(chain[-1], int(rng.integers(0, 1 << 40))))
        tail = 0 if rng.random() < 0.3 else int(rng.integers(1, BLOCK))
        prompt = len(chain) * BLOCK - (BLOCK - tail if tail else 0)
        now += float(rng.exponential(0.5))
        out.append(RequestRecord(f"{name}-{i}", now, prompt, block_hashes=tuple(chain),
                                 block_size_tokens=BLOCK))
    return out


def fleet_batches(fleet: dict[str, list[RequestRecord]], engines: dict[str, str],
                  per_batch: int = 16) -> Iterator[EventBatch]:
    """Each instance's records in batches of ``per_batch``, the instances' batches
    interleaved as one collector receives them."""
    queues = {name: [records[i:i + per_batch] for i in range(0, len(records), per_batch)]
              for name, records in fleet.items()}
    sequence = 0
    while any(queues.values()):
        for name, queue in queues.items():
            if queue:
                origin = Origin(engines[name], name, f"test:{name}")
                yield EventBatch.from_rows(origin, sequence, requests=queue.pop(0))
                sequence += 1


def stored_batches(path: Path) -> Iterator[EventBatch]:
    """The batches a store holds, in the order it took them, each as it arrived."""
    with TraceStore(path, read_only=True) as store:
        ledger = store.query("SELECT batch_id, source, sequence, engine, instance FROM "
                             "ingested_batches ORDER BY batch_id", []).to_pylist()
        for row in ledger:
            tables = [store.query(f"SELECT * EXCLUDE (batch_id) FROM {table} WHERE batch_id = ?",
                                  [row["batch_id"]])
                      for table in ("block_events", "requests", "metric_intervals")]
            yield EventBatch(Origin(row["engine"], row["instance"], row["source"]),
                             row["sequence"], tables[0], tables[1], metric_intervals=tables[2])


def replayed_hit_ratio(records, semantics: str, gpu_tokens: int, cpu_tokens: int,
                       cold_tokens: int = 0, block_tokens: int = BLOCK) -> float:
    """The simulator's token hit ratio (every tier) over ``records`` in arrival order."""
    ordered = sorted(records, key=lambda r: r.arrival_s)
    result = Simulator(SimConfig(gpu_blocks=gpu_tokens // block_tokens,
                                 cpu_blocks=cpu_tokens // block_tokens,
                                 cold_blocks=cold_tokens // block_tokens,
                                 semantics=semantics)).replay(ordered)
    served = result.gpu_hit_tokens + result.cpu_promotion_tokens + result.cold_promotion_tokens
    return served / result.prompt_tokens
