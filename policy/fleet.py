"""A fleet's analyses from its instances' (each instance has its own prefix cache, so a fleet
is replayed instance by instance and the results are merged here).

Merging rules, the same whatever order or process the instances ran in (the caller passes
them in instance-name order):

* token and block counts add up; ratios are recomputed from the sums;
* TTFT percentiles are those of every request of the fleet together (each request queued at
  its own instance's prefill servers), from the per-request samples; the mean service time
  is over all requests; ``utilisation`` is the busiest instance's (a fleet saturates where
  its busiest prefill does);
* an LRU->Belady gap closed is recomputed on the merged ratios.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Sequence

import numpy as np

from kvtier.policy.cost import TtftEstimate, ttft_summary
from kvtier.policy.sim.result import SimResult
from kvtier.policy.whatif import WhatIf

#: evaluate's per-policy counts that add up across instances
SUMMED_ROW_FIELDS = ("gpu_hit_tokens", "cpu_promotion_tokens", "cold_promotion_tokens",
                     "recompute_tokens", "prompt_tokens", "cpu_stores_total")


@dataclass(frozen=True)
class FleetReplay:
    """One replay per instance and the fleet's totals."""

    instances: tuple[str, ...]
    parts: tuple[WhatIf, ...]
    total: WhatIf

    def to_dict(self) -> dict:
        return {**self.total.to_dict(), "instances": [
            {"instance": name, **part.to_dict()} for name, part in zip(self.instances, self.parts)]}


def merge_ttft(estimates: Sequence[TtftEstimate], samples: Sequence[np.ndarray]) -> TtftEstimate:
    """The fleet's TTFT from its instances' estimates and per-request samples."""
    if len(estimates) != len(samples) or not estimates:
        raise ValueError(f"need one sample array per estimate, got {len(estimates)} and {len(samples)}")
    together = np.concatenate([np.asarray(s, dtype=float) for s in samples])
    requests = sum(e.requests for e in estimates)
    if len(together) != requests:
        raise ValueError(f"{len(together)} TTFT samples for {requests} requests")
    mean_service = (sum(e.mean_service_s * e.requests for e in estimates) / requests
                    if requests else 0.0)
    loads = [e.utilisation for e in estimates if np.isfinite(e.utilisation)]  # NaN: not a queue
    return ttft_summary(together, mean_service, max(loads) if loads else float("nan"),
                        estimates[0].parameter_sources)


def merge_results(results: Sequence[SimResult]) -> SimResult:
    """Counts of several replays added up."""
    return SimResult(**{f.name: sum(getattr(r, f.name) for r in results) for f in fields(SimResult)})


def merge_replays(parts: Sequence[tuple[str, WhatIf]]) -> FleetReplay:
    """``simulate`` over a fleet: per-instance what-ifs and their total."""
    if not parts:
        raise ValueError("no instances to merge")
    names, replays = zip(*parts)
    samples = [r.ttft_samples_s for r in replays]
    total = WhatIf(merge_results([r.result for r in replays]),
                   merge_ttft([r.ttft for r in replays], samples), np.concatenate(samples))
    return FleetReplay(tuple(names), tuple(replays), total)


def merge_curves(parts: Sequence[tuple[str, dict]]) -> dict:
    """``simulate --sweep`` over a fleet: at each capacity (per instance), the fleet's hit
    ratio is the prompt-token-weighted mean of its instances'."""
    if not parts:
        raise ValueError("no instances to merge")
    names, outputs = zip(*parts)
    prompt = [o["prompt_tokens"] for o in outputs]
    total = sum(prompt)
    curve = []
    for i, point in enumerate(outputs[0]["curve"]):
        hits = sum(o["curve"][i]["token_hit_ratio"] * p for o, p in zip(outputs, prompt))
        curve.append({**point, "token_hit_ratio": hits / total if total else 0.0})
    return {**outputs[0], "prompt_tokens": total, "curve": curve,
            "instances": [{"instance": n, **o} for n, o in zip(names, outputs)]}


def merge_policy_rows(per_instance: Sequence[Sequence[dict]]) -> list[dict]:
    """``evaluate``'s rows (one per policy, with ``ttft_samples_s``) of several instances ->
    the fleet's rows, in the first instance's policy order, gap closed recomputed."""
    by_policy: dict[str, list[dict]] = {}
    for rows in per_instance:
        for row in rows:
            by_policy.setdefault(row["policy"], []).append(row)
    merged = []
    for name, rows in by_policy.items():
        if len(rows) != len(per_instance):
            raise ValueError(f"policy {name!r} ran on {len(rows)} of {len(per_instance)} instances")
        sums = {key: sum(r[key] for r in rows) for key in SUMMED_ROW_FIELDS}
        hits = sums["gpu_hit_tokens"] + sums["cpu_promotion_tokens"] + sums["cold_promotion_tokens"]
        samples = np.concatenate([r["ttft_samples_s"] for r in rows])
        ttft = ttft_summary(samples, 0.0, max(r["prefill_utilisation"] for r in rows))
        merged.append({"policy": name, **sums,
                       "token_hit_ratio": hits / sums["prompt_tokens"] if sums["prompt_tokens"] else 0.0,
                       "ttft_p50_s": ttft.p50_s, "ttft_p95_s": ttft.p95_s, "ttft_p99_s": ttft.p99_s,
                       "prefill_utilisation": ttft.utilisation})
    _gap_closed(merged)
    return merged


def _gap_closed(rows: list[dict]) -> None:
    # the same rule as kvtier.policy.learn.compare.add_gap_closed, on the merged ratios
    from kvtier.policy.learn.compare import add_gap_closed

    add_gap_closed(rows)


def merge_evaluations(parts: Sequence[tuple[str, dict]]) -> dict:
    """``evaluate`` over a fleet: the merged policy rows, the summed request counts, and each
    instance's own output (its rows, models and thresholds), without the TTFT samples."""
    if not parts:
        raise ValueError("no instances to merge")
    names, outputs = zip(*parts)
    first = outputs[0]
    fleet = {key: first[key] for key in ("gpu_blocks", "cpu_blocks", "cold_blocks", "block_tokens")
             if key in first}
    fleet.update(train_requests=sum(o["train_requests"] for o in outputs),
                 evaluated_requests=sum(o["evaluated_requests"] for o in outputs),
                 policies=merge_policy_rows([o["policies"] for o in outputs]),
                 prefill_servers=[o.get("prefill_servers") for o in outputs], learned={})
    fleet["instances"] = [{"instance": n, **without_samples(o)} for n, o in zip(names, outputs)]
    return fleet


def without_samples(output: dict) -> dict:
    """An evaluate output with its rows' ``ttft_samples_s`` left out (for printing)."""
    return {**output, "policies": [{k: v for k, v in r.items() if k != "ttft_samples_s"}
                                   for r in output["policies"]]}
