"""Compare CPU-tier policies on the later part of a trace: the ``kvtier evaluate`` engine.

Every policy replays the same records with the same GPU LRU tier; totals and TTFT count the
evaluation window only (the training part, if it precedes it in the same replay, only warms
the tiers). ``learned`` is LRU behind the gradient-boosted admission model, ``learned-logistic``
behind the logistic baseline; both are trained on the training records at the evaluated
capacity and their threshold is swept on the training period's latest slice. The rows
``recommend`` never deploys live in ``baselines/``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from kvtier.policy.cost import CostParams, queue_ttft, queue_ttft_samples
from kvtier.policy.learn.admission_model import ModelConfig
from kvtier.policy.learn.baselines.nextuse_rows import NAMES as NEXT_USE_NAMES
from kvtier.policy.learn.baselines.nextuse_rows import ChoiceCache, policy_for, shadow_summary
from kvtier.policy.learn.baselines.gpu_sightings import SIGHTINGS_GPU
from kvtier.policy.learn.baselines.oracle_reused import ORACLE_REUSED, ReusedLaterAdmitter
from kvtier.policy.learn.baselines.retention_tier import RETENTION, retention_policy
from kvtier.policy.learn.pairs import (GPU_SIGHTINGS, FittedInputs, PairChoice, choose_pair,
                                       replay_deployed)
from kvtier.policy.learn.pipeline import fit
from kvtier.policy.learn.replay import Replayed, Tiers, replay
from kvtier.policy.learn.split import Split
from kvtier.policy.sim.policies import policy_names

DEFAULT_COSTS = CostParams()
LEARNED = {"learned": "gbm", "learned-logistic": "logistic"}
RECOMMENDED = "recommended"  # what recommend deploys: the pair chosen on the training period


def base_policies() -> tuple[str, ...]:
    """The registered eviction policies compared as plain CPU tiers (the registry's
    ``evaluate`` entries, read at call time so a policy registered in Python is among them)."""
    return policy_names("exclusive", evaluate=True)


def evaluated_names() -> tuple[str, ...]:
    """Every row name :func:`compare` accepts."""
    return (*base_policies(), *LEARNED, RETENTION, *NEXT_USE_NAMES, RECOMMENDED, ORACLE_REUSED,
            SIGHTINGS_GPU)

UNSAFE_BELOW_LRU = 1e-4  # a row this far below LRU's hit ratio lost to it on later time


def compare(split: Split, tiers: Tiers, policies: Sequence[str], *, seed: int = 0,
            params: CostParams = DEFAULT_COSTS, servers: int = 1,
            progress: Callable[[str], None] | None = None,
            keep_ttft_samples: bool = False, importance: bool = False,
            candidates: bool = False) -> dict:
    """One row per policy (see :func:`row`), plus the LRU->Belady gap each closes.
    ``importance``: the next-use rows' summaries carry the model's permutation importance
    on the evaluated requests (:mod:`kvtier.policy.learn.importance`). ``candidates``:
    ``recommended``'s summary also carries every candidate pair deployed on the evaluated
    requests (:func:`candidates_evaluated`; ``progress`` is called once per pair replayed)."""
    allowed, base = evaluated_names(), base_policies()
    unknown = [p for p in policies if p not in allowed]
    if unknown or not policies:
        raise ValueError(f"unknown policies {', '.join(unknown) or '(none)'}; allowed: "
                         f"{', '.join(allowed)}")
    rows, fitted_by_name, summaries = [], {}, {}
    choices = ChoiceCache(split, tiers, seed, importance=importance)
    for name in policies:
        if progress is not None:
            progress(name)
        if name in NEXT_USE_NAMES:
            cpu_policy, summaries[name], built = policy_for(name, choices)
            replayed = replay(split.records, tiers, cpu_policy, count_from=split.count_from,
                              trace=split.trace)
            summaries[name]["shadow"] = shadow_summary(built)
            rows.append(row(name, replayed, params, servers,
                            keep_ttft_samples=keep_ttft_samples))
            continue
        if name == RECOMMENDED:
            choice = choose_pair(split.train, tiers, trace=split.train_trace, seed=seed)
            summaries[name] = pair_summary(choice)
            inputs, built = FittedInputs(choice, split.records, tiers, split.trace), []
            replayed = replay_deployed(choice, split.records, tiers,
                                       count_from=split.count_from, trace=split.trace,
                                       inputs=inputs, built=built)
            summaries[name]["shadow"] = shadow_summary(built)
            if candidates:
                summaries[name]["candidates"] = candidates_evaluated(
                    choice, split, tiers, replayed.result.token_hit_ratio, progress, inputs)
            rows.append(row(name, replayed, params, servers, keep_ttft_samples=keep_ttft_samples))
            continue
        admitter = None
        if name in LEARNED:
            fitted = fit(split.train, split.records, tiers,
                         ModelConfig(kind=LEARNED[name], seed=seed),
                         shares_replay=split.count_from > 0, train_trace=split.train_trace,
                         scored_trace=split.trace)
            admitter = fitted.admitter()
            fitted_by_name[name] = fitted
            summaries[name] = _learned_summary(fitted)
        elif name == ORACLE_REUSED:
            admitter = ReusedLaterAdmitter(split.records, trace=split.trace)
        cpu_policy = name if name in base else "lru"
        if name == RETENTION:
            cpu_policy, summaries[name] = retention_policy(split, tiers,
                                                           fitted_by_name.get("learned"), seed)
        replayed = replay(split.records, tiers, cpu_policy, admitter=admitter,
                          count_from=split.count_from, trace=split.trace,
                          gpu_sightings=GPU_SIGHTINGS if name == SIGHTINGS_GPU else 0)
        rows.append(row(name, replayed, params, servers, keep_ttft_samples=keep_ttft_samples))
    add_gap_closed(rows)
    mark_unsafe(rows)
    return {"gpu_blocks": tiers.gpu_blocks, "cpu_blocks": tiers.cpu_blocks,
            "cold_blocks": tiers.cold_blocks, "train_requests": len(split.train),
            "evaluated_requests": len(split.records) - split.count_from, "policies": rows,
            "learned": summaries}


def row(name: str, replayed: Replayed, params: CostParams, servers: int = 1, *,
        keep_ttft_samples: bool = False) -> dict:
    """``token_hit_ratio``, tokens per outcome, and estimated TTFT percentiles (``servers``
    prefill servers share the queue); with ``keep_ttft_samples``, each request's TTFT too
    (``ttft_samples_s``, so several instances' rows can be summarised together)."""
    result = replayed.result
    services = [params.service_s(o.cpu_promotion_tokens, o.cold_promotion_tokens,
                                 o.recompute_tokens) for o in replayed.outcomes]
    recompute_s = sum(params.prefill_s(r.prompt_tokens - o.recompute_tokens, o.recompute_tokens)
                      for r, o in zip(replayed.requests, replayed.outcomes))
    promotion_s = sum(params.promotion_s(o.cpu_promotion_tokens, "cpu")
                      + params.promotion_s(o.cold_promotion_tokens, "cold")
                      for o in replayed.outcomes)
    ttft = queue_ttft([r.arrival_s for r in replayed.requests], services, params.sources(),
                      servers)
    extra = {}
    if keep_ttft_samples:
        extra["ttft_samples_s"] = queue_ttft_samples([r.arrival_s for r in replayed.requests],
                                                     services, servers)
    return {**extra, "policy": name, "token_hit_ratio": result.token_hit_ratio,
            "gpu_hit_tokens": result.gpu_hit_tokens,
            "cpu_promotion_tokens": result.cpu_promotion_tokens,
            "cold_promotion_tokens": result.cold_promotion_tokens,
            "recompute_tokens": result.recompute_tokens, "prompt_tokens": result.prompt_tokens,
            "cpu_stores_total": result.cpu_stores_total,
            "recompute_prefill_s": recompute_s, "prefill_s": recompute_s + promotion_s,
            "ttft_p50_s": ttft.p50_s,
            "ttft_p95_s": ttft.p95_s, "ttft_p99_s": ttft.p99_s,
            "prefill_utilisation": ttft.utilisation}


def add_gap_closed(rows: list[dict]) -> None:
    """``gap_closed``: (policy - LRU) / (Belady - LRU) in token hit ratio, and
    ``prefill_gap_closed``: (LRU - policy) / (LRU - Belady) in prefill seconds, when both ran
    and differ (rows without prefill seconds, like libCacheSim's, get ``None``)."""
    by_name = {r["policy"]: r for r in rows}
    lru, belady = by_name.get("lru"), by_name.get("belady")
    for r in rows:
        gap = None if lru is None or belady is None else (
            belady["token_hit_ratio"] - lru["token_hit_ratio"])
        r["gap_closed"] = (r["token_hit_ratio"] - lru["token_hit_ratio"]) / gap if gap else None
        seconds = None
        if lru is not None and belady is not None and "prefill_s" in r and "prefill_s" in lru:
            seconds = lru["prefill_s"] - belady["prefill_s"]
        r["prefill_gap_closed"] = ((lru["prefill_s"] - r["prefill_s"]) / seconds
                                   if seconds else None)


def mark_unsafe(rows: list[dict]) -> None:
    """``unsafe``: the row lost to LRU on the evaluated (later) requests, by token hit ratio
    (``None`` without an LRU row; LRU and Belady are never unsafe)."""
    lru = next((r["token_hit_ratio"] for r in rows if r["policy"] == "lru"), None)
    for r in rows:
        r["unsafe"] = (None if lru is None else
                       r["policy"] not in ("lru", "belady")
                       and r["token_hit_ratio"] < lru - UNSAFE_BELOW_LRU)


def pair_summary(choice: PairChoice) -> dict:
    """``recommended``'s choice for evaluate's output: the pair, why, every candidate's
    validation figure."""
    return {"deploys": choice.pair.label, "why": choice.why,
            "chosen_on": (f"training period's latest {choice.validation_requests} requests, "
                          f"fitted on the {choice.fit_requests} before them"),
            "validation": [[v.pair.label, v.hit_ratio] for v in choice.validation]}


def candidates_evaluated(choice: PairChoice, split: Split, tiers: Tiers,
                         chosen_hit_ratio: float,
                         progress: Callable[[str], None] | None = None,
                         inputs: FittedInputs | None = None) -> list[dict]:
    """Every candidate pair of ``choice`` deployed as ``recommended`` deploys the chosen one
    (its learned parts as fitted, behind plain LRU's shadow), counted on the evaluated
    requests beside its validation figure: whether a shortfall on later time is the choice's
    (another candidate served more) or the candidates' (none did). The chosen pair's row is
    the ``recommended`` row's replay (``chosen_hit_ratio``), not replayed again; the fitted
    parts' inputs are worked out once for all of them (``inputs``: the row's, if it made
    them)."""
    if inputs is None:
        inputs = FittedInputs(choice, split.records, tiers, split.trace)
    out = []
    for validated in choice.validation:
        chosen = validated.pair == choice.pair
        if chosen:
            later = chosen_hit_ratio
        else:
            if progress is not None:
                progress(f"{RECOMMENDED} candidate: {validated.pair.label}")
            later = replay_deployed(dataclasses.replace(choice, pair=validated.pair),
                                    split.records, tiers, count_from=split.count_from,
                                    trace=split.trace, inputs=inputs).result.token_hit_ratio
        out.append({"pair": validated.pair.label, "chosen": chosen,
                    "validation_hit_ratio": validated.hit_ratio, "evaluated_hit_ratio": later})
    return out


def _learned_summary(fitted) -> dict:
    return {"threshold": fitted.threshold, "sweep": [list(p) for p in fitted.sweep],
            "train_offers": fitted.train_offers,
            "train_positive_rate": fitted.train_positive_rate, "model": fitted.model.card()}

