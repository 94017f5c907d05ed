"""The live curves and the headroom signal as Prometheus series (read at scrape time from
the last refresh; nothing is computed here).

=================================================  ==================================================
``kvtier_live_hit_ratio``                          token hit ratio (every tier together) with ``tier``
                                                   (cpu, or cold under the configured CPU size) at
                                                   ``size_tokens``, by ``window`` (``300s``..., ``all``)
``kvtier_live_reach_bytes`` / ``_tokens``          the CPU-tier size for ``percent`` % of the hits a
                                                   CPU tier up to the largest size tracked adds
``kvtier_live_saved_prefill_seconds_per_gib``      prefill seconds saved per second of traffic by each
                                                   GiB from the ladder's size below (a cost file given)
``kvtier_live_requests``                           requests in the window
``kvtier_live_kv_bytes_per_token``                 the KV bytes a token takes, by ``source``
``kvtier_live_memory_bytes``                       what the instance's curve holds in memory
``kvtier_live_unsized_requests_total``             requests not counted: no GPU size for the instance
``kvtier_tier_saved_tokens_per_second``            prompt tokens each ``tier`` served (prefill saved)
``kvtier_prefill_utilisation``                     the prefill server's busy share under the cost model
``kvtier_headroom_load_factor``                    how many times the arrival rate fits in the p99 TTFT
                                                   budget, ``tiers="as_served"`` or ``"without_offload"``
=================================================  ==================================================

Every series carries ``engine`` and ``engine_instance``; the headroom's carry ``costs``
(``calibrated``: a cost file; ``default``: kvtier's assumed prefill speed and links).
"""

from __future__ import annotations

from collections.abc import Iterator

from kvtier.collector.exports.prometheus import Sample
from kvtier.policy.livecurve.curve_values import CurveFile, InstanceCurves

HELP = {
    "kvtier_live_hit_ratio": "Token hit ratio the instance would get with the tier at this size "
                             "(live LRU stack distances, the engine's tier semantics)",
    "kvtier_live_reach_bytes": "CPU-tier bytes for this percent of the hits a CPU tier adds",
    "kvtier_live_reach_tokens": "CPU-tier tokens for this percent of the hits a CPU tier adds",
    "kvtier_live_saved_prefill_seconds_per_gib": "Prefill seconds saved per second by each GiB "
                                                 "from the ladder's size below to this one",
    "kvtier_live_requests": "Requests the window's curve counts",
    "kvtier_live_kv_bytes_per_token": "KV cache bytes per token the curve's bytes use",
    "kvtier_live_memory_bytes": "Memory the instance's live curve holds",
    "kvtier_live_unsized_requests_total": "Requests no curve counted: the instance's GPU size is "
                                          "not known",
    "kvtier_tier_saved_tokens_per_second": "Prompt tokens per second each tier served instead of "
                                           "prefill (the engine's measured split)",
    "kvtier_prefill_utilisation": "The prefill server's busy share under the cost model",
    "kvtier_headroom_load_factor": "Factor the arrival rate can grow by before p99 TTFT passes "
                                   "the budget (below 1: already past it)",
}


def curve_samples(curves: CurveFile) -> Iterator[Sample]:
    for one in curves.instances:
        yield from _instance_samples(one)


def _sample(name: str, value: float, labels: dict) -> Sample:
    return Sample(name, HELP[name], float(value), labels)


def _instance_samples(one: InstanceCurves) -> Iterator[Sample]:
    who = {"engine": one.engine, "engine_instance": one.instance}
    if one.gpu_tokens is None:
        yield _sample("kvtier_live_unsized_requests_total", one.unsized_requests, who)
        return
    yield _sample("kvtier_live_memory_bytes", one.memory_bytes, who)
    yield _sample("kvtier_live_kv_bytes_per_token", one.kv_bytes_per_token,
                  {**who, "source": one.kv_bytes_source})
    for window in one.windows:
        at = {**who, "window": window.window}
        yield _sample("kvtier_live_requests", window.requests, at)
        for point in window.points:
            sized = {**at, "tier": point.tier, "size_tokens": str(point.size_tokens)}
            yield _sample("kvtier_live_hit_ratio", point.hit_ratio, sized)
            if point.saved_prefill_s_per_gib is not None:
                yield _sample("kvtier_live_saved_prefill_seconds_per_gib",
                              point.saved_prefill_s_per_gib, sized)
        for reach in window.reach:
            share = {**at, "percent": str(reach.percent)}
            yield _sample("kvtier_live_reach_bytes", reach.size_bytes, share)
            yield _sample("kvtier_live_reach_tokens", reach.size_tokens, share)
    room = one.headroom
    if room is not None:
        priced = {**who, "costs": room.costs}
        for tier, rate in room.saved_tokens_per_s.items():
            yield _sample("kvtier_tier_saved_tokens_per_second", rate, {**who, "tier": tier})
        yield _sample("kvtier_prefill_utilisation", room.utilisation, priced)
        yield _sample("kvtier_headroom_load_factor", room.load_factor,
                      {**priced, "tiers": "as_served"})
        yield _sample("kvtier_headroom_load_factor", room.load_factor_without_offload,
                      {**priced, "tiers": "without_offload"})
