"""Per-engine settings from the recommendation's choices, each checked by its writer.

TensorRT-LLM and Dynamo take the learned priority threshold directly; vLLM, LMCache and
SGLang cannot gate by a per-block priority, so they get the CPU size and their nearest knob
(SGLang: selective write-through when admission helps), with a note saying what is lost.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvtier.policy.recommend.values import ColdTierDecision
from kvtier.policy.writers import ENGINES, writer
from kvtier.policy.writers.settings import EngineSettings
from kvtier.policy.writers.trtllm_retention import RetentionClass


@dataclass(frozen=True)
class _VllmFile:
    decision: ColdTierDecision | None
    cold_bytes: int
    cold_path: str | None


def neutral(cpu_bytes: int, min_priority: int | None, classes) -> EngineSettings:
    return EngineSettings(cpu_tier_bytes=cpu_bytes, offload_min_priority=min_priority,
                          retention_priorities=tuple(classes), kv_events=True)


def settings(cpu_bytes: int, min_priority: int, classes, admission_helps: bool, *,
             ranges: tuple[RetentionClass, ...] = (), range_min_priority: int | None = None,
             vllm_cpu: tuple[str, int] = ("lru", 0), cold: ColdTierDecision | None = None,
             cold_bytes: int = 0, cold_path: str | None = None,
             vllm_cpu_bytes: int | None = None):
    """``((engine, EngineSettings), ...)`` and ``((engine, note), ...)``. ``ranges``: the
    per-request-class token-range retention TensorRT-LLM gets, and ``range_min_priority`` the
    offload threshold swept over the priorities those ranges assign (``None``: no ranges;
    TensorRT-LLM then gets the per-block threshold and classes). ``vllm_cpu``: the replayed
    best ``(eviction_policy, store_threshold)`` for vLLM, ``vllm_cpu_bytes`` its CPU tier
    (default ``cpu_bytes``; larger, as vLLM's holds a copy of the GPU's blocks). ``cold``:
    vLLM's file-tier decision (``None``: none was considered), its size ``cold_bytes`` and
    directory ``cold_path``."""
    vllm_file = _VllmFile(cold, cold_bytes, cold_path)
    trtllm = (EngineSettings(cpu_tier_bytes=cpu_bytes, offload_min_priority=range_min_priority,
                             retention_ranges=tuple(ranges), kv_events=True)
              if ranges and range_min_priority is not None else
              EngineSettings(cpu_tier_bytes=cpu_bytes, offload_min_priority=min_priority,
                             retention_priorities=tuple(classes), kv_events=True))
    gate = "the learned priority gate"
    candidates = {
        "trtllm": trtllm,
        "dynamo": EngineSettings(cpu_tier_bytes=cpu_bytes, offload_min_priority=min_priority,
                                 kv_events=True),
        "vllm": _vllm(cpu_bytes if vllm_cpu_bytes is None else vllm_cpu_bytes, vllm_cpu,
                      vllm_file),
        "lmcache": EngineSettings(cpu_tier_bytes=cpu_bytes, eviction_policy="lru"),
        "sglang": EngineSettings(cpu_tier_bytes=cpu_bytes, eviction_policy="lru",
                                 write_policy="write_through_selective" if admission_helps
                                 else "write_through"),
    }
    notes = [("vllm", (f"vLLM cannot express {gate}; eviction_policy={vllm_cpu[0]}, "
                       f"store_threshold={vllm_cpu[1]} is the best of lru/arc x 0, 2, 3 "
                       "replayed under vLLM's semantics")),
             *([("vllm", (f"cpu_tier_bytes is {vllm_cpu_bytes} for vLLM ({cpu_bytes} beyond the "
                          "GPU tier): vLLM's CPU tier also holds a copy of the blocks it "
                          "stores from the GPU"))]
               if vllm_cpu_bytes not in (None, cpu_bytes) else []),
             *_file_notes(vllm_file),
             ("lmcache", (f"LMCache's priority_limit is per request, not per block: {gate} "
                          "is not applied")),
             ("trtllm", ("the gateway should send each request class's KvCacheRetentionConfig "
                         f"(trtllm.retention.json): {_ranges_text(ranges)}; "
                         f"offload_min_priority={range_min_priority} is the best threshold over "
                         "the priorities those ranges give (evidence: token_range_sweep); the "
                         "expected change is measured for the per-block gate, which token "
                         "ranges approximate"))]
    return _checked(candidates, notes)


def _vllm(cpu_bytes: int, vllm_cpu: tuple[str, int], vllm_file: _VllmFile) -> EngineSettings:
    policy, store_threshold = vllm_cpu
    decision, cold_bytes, cold_path = vllm_file.decision, vllm_file.cold_bytes, vllm_file.cold_path
    if decision is not None and decision.add and cold_path:
        # TieringOffloadingSpec refuses store_threshold >= 2; the gain was replayed at 0
        return EngineSettings(cpu_tier_bytes=cpu_bytes, eviction_policy=policy,
                              store_threshold=0, cold_tier_bytes=cold_bytes,
                              cold_tier_path=cold_path, kv_events=True)
    return EngineSettings(cpu_tier_bytes=cpu_bytes, eviction_policy=policy,
                          store_threshold=store_threshold, kv_events=True)


def _file_notes(vllm_file: _VllmFile) -> list:
    decision, cold_bytes, cold_path = vllm_file.decision, vllm_file.cold_bytes, vllm_file.cold_path
    if decision is None:
        return []
    notes = [("vllm", f"candidate file tier of {cold_bytes} bytes: {decision.reason}")]
    if decision.add and not cold_path:
        notes.append(("vllm", ("the file tier is not written to the config: give --cold-path "
                               "DIR (an absolute path on the file system kvtier probe fs "
                               "measured)")))
    elif decision.add:
        notes.append(("vllm", ("with the file tier store_threshold is 0: vLLM's "
                               "TieringOffloadingSpec refuses any other")))
    return notes


def _ranges_text(ranges) -> str:
    return "; ".join(
        f"{c.name}: " + ", ".join(f"tokens {r.token_start}-{r.token_end or 'end'} -> {r.priority}"
                                  for r in c.token_ranges) + f", decode -> {c.decode_priority}"
        for c in ranges) or "none"


def off() -> tuple:
    """Offloading off where an engine can say so (vLLM: drop the transfer config instead)."""
    candidates = {e: EngineSettings(cpu_tier_bytes=0) for e in ENGINES if e != "vllm"}
    return _checked(candidates, [])[0]


def _checked(candidates: dict, notes: list) -> tuple[tuple, tuple]:
    good = []
    for engine, value in candidates.items():
        try:
            writer(engine).validate(value)
        except ValueError as error:
            notes.append((engine, f"not written: {error}"))
            continue
        good.append((engine, value))
    return tuple(good), tuple(notes)
