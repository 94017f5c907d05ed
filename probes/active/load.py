"""The load probe: replay a trace's prefix structure against an OpenAI-compatible server.

For each concurrency level of the ramp, the next ``requests_per_level`` trace requests are
sent by that many closed-loop workers (each sends its next request when the previous one
finishes), in trace order. Every request becomes a ``RequestRecord`` (TTFT, mean ITL, e2e,
the tokens each tier served when the server reports them, the trace's block ids) and the
summary gives p50/p95/p99 per level, overall and for long vs short prompts (split at the
median prompt length of the run).
"""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Iterable

from kvtier.collector.events import RequestRecord
from kvtier.probes.active.client import Completion
from kvtier.probes.active.prompts import PromptBuilder
from kvtier.probes.active.stats import percentiles

METRICS = ("ttft_s", "itl_s", "e2e_latency_s")


@dataclass(frozen=True)
class LoadConfig:
    concurrency: tuple[int, ...] = (1, 2, 4)
    requests_per_level: int = 64
    max_tokens: int = 16
    block_tokens: int = 16
    max_blocks: int | None = 32
    vocab_size: int = 512
    tier_config_id: str | None = None  # names the phase when the server does not say

    def __post_init__(self) -> None:
        if not self.concurrency or any(not isinstance(c, int) or c < 1 for c in self.concurrency):
            raise ValueError(f"concurrency levels must be ints >= 1, got {self.concurrency!r}")
        for name in ("requests_per_level", "max_tokens", "block_tokens", "vocab_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)!r}")


@dataclass(frozen=True)
class LoadResult:
    run_id: str
    records: tuple[RequestRecord, ...]
    concurrency_of: dict  # request_id -> concurrency level
    errors: tuple[str, ...]

    def summary(self) -> dict:
        levels = {}
        for level in sorted(set(self.concurrency_of.values())):
            levels[str(level)] = _summarise([r for r in self.records if self.concurrency_of[r.request_id] == level])
        return {"overall": _summarise(self.records), "by_concurrency": levels,
                "long": _summarise([r for r in self.records if r.request_type == "long"]),
                "short": _summarise([r for r in self.records if r.request_type == "short"])}

    def to_dict(self) -> dict:
        return {"probe": "load", "run_id": self.run_id, "requests": len(self.records),
                "errors": len(self.errors), "first_errors": list(self.errors[:5]), **self.summary()}


def _summarise(records) -> dict:
    out = {"requests": len(records)}
    for metric in METRICS:
        out[metric] = percentiles([getattr(r, metric) for r in records])
    tokens = {k: sum(getattr(r, k) or 0 for r in records)
              for k in ("gpu_hit_tokens", "cpu_promotion_tokens", "cold_promotion_tokens", "recomputed_tokens")}
    out["tokens"] = tokens
    return out


# send(prompt_ids, max_tokens, request_id=..., kv_transfer_params=...) -> Completion
Send = Callable[..., Completion]
# The OpenAI API's finish_reason -> the schema's finish_status.
FINISH_STATUS = {"stop": "stopped", "tool_calls": "stopped", "length": "length",
                 "abort": "aborted", "error": "error"}


def run_load(trace: Iterable[RequestRecord], send: Send, config: LoadConfig = LoadConfig(), *,
             progress: Callable[[str], None] = lambda line: None) -> LoadResult:
    """Run the ramp. ``send(prompt_ids, max_tokens, request_id=, kv_transfer_params=)``
    performs one timed request; the request id names the record, and the trace's session and
    turn travel as ``kv_transfer_params`` (``{"kvtier": {...}}``) when the trace has them."""
    builder = PromptBuilder(config.block_tokens, config.vocab_size, max_blocks=config.max_blocks)
    source = iter(trace)
    run_id = uuid.uuid4().hex[:8]
    jobs = []
    for level in config.concurrency:
        batch = [r for _, r in zip(range(config.requests_per_level), source)]
        jobs.append((level, [(r, builder.prompt(r), builder.block_ids(r)) for r in batch]))
    median = _median_length([p for _, batch in jobs for _, p, _ in batch])
    records, levels, errors = [], {}, []
    for level, batch in jobs:
        progress(f"load: {len(batch)} requests at concurrency {level}")
        named = [(f"load-{run_id}-c{level}-{i}", job) for i, job in enumerate(batch)]

        def one(item):
            request_id, (record, prompt, _) = item
            return send(prompt, config.max_tokens, request_id=request_id,
                        kv_transfer_params=_tags(record))

        with ThreadPoolExecutor(level) as pool:
            done = list(pool.map(lambda item: (item, one(item)), named))
        for (request_id, (record, prompt, ids)), completion in done:
            if completion.error is not None:
                errors.append(completion.error)
                continue
            records.append(_record(request_id, record, prompt, ids, completion, config,
                                   "long" if len(prompt) > median else "short"))
            levels[request_id] = level
    return LoadResult(run_id, tuple(records), levels, tuple(errors))


def _tags(record: RequestRecord) -> dict | None:
    tags = {name: value for name, value in (("session_id", record.session_id), ("turn", record.turn))
            if value is not None}
    return {"kvtier": tags} if tags else None


def _median_length(prompts: list[list[int]]) -> float:
    lengths = sorted(len(p) for p in prompts)
    return lengths[len(lengths) // 2] if lengths else 0


def _record(request_id, trace_record, prompt, ids, c: Completion, config: LoadConfig, kind: str) -> RequestRecord:
    tiers = c.tiers or {}
    return RequestRecord(
        request_id=request_id, arrival_s=c.sent_s, prompt_tokens=len(prompt), output_tokens=c.output_tokens,
        block_hashes=tuple(ids), block_size_tokens=config.block_tokens,
        gpu_hit_tokens=tiers.get("gpu_hit_tokens"),  # None when the server does not say
        cpu_promotion_tokens=tiers.get("cpu_promotion_tokens"),
        cold_promotion_tokens=tiers.get("cold_promotion_tokens"),
        recomputed_tokens=tiers.get("recomputed_tokens"),
        ttft_s=c.ttft_s, itl_s=c.itl_s, e2e_latency_s=c.e2e_s,
        tier_config_id=tiers.get("tier_config_id") or config.tier_config_id,
        session_id=trace_record.session_id, parent_request_id=trace_record.request_id,
        request_type=kind, turn=trace_record.turn,
        finish_status=FINISH_STATUS.get(c.finish_reason), stop_reason=c.stop_reason, model=c.model)


