"""The registry of scrape profiles: per engine, where it serves Prometheus text and which
metric families kvtier keeps. Standard library only (the command line's help names them).

Metric names from vLLM 0.33.0 ``vllm/v1/metrics/loggers.py``, TensorRT-LLM
``tensorrt_llm/metrics/collector.py``, SGLang's ``metrics_collector.py``, LMCache's
``docs/source/production/observability/metrics.rst`` at ``cce4a08`` and Dynamo's
``prometheus_names.rs`` at ``628d4ec``:

=========  ==========================  =============================================
engine     default endpoint            kept metric families
=========  ==========================  =============================================
vllm       :8000/metrics               ``vllm:kv_offload_*``, ``vllm:prefix_cache_*``,
                                       ``vllm:prompt_tokens_cached*``, TTFT/ITL, ...
lmcache    :6999/metrics (or vLLM's)   ``lmcache:*``, ``lmcache_mp_*`` (``lmcache server``)
sglang     :30000/metrics              ``sglang:*``
dynamo     :6880/metrics (KVBM)        ``kvbm_*``, ``dynamo_component_*`` (a worker's
                                       system port), ``dynamo_frontend_*``
trtllm     :8000/prometheus/metrics    ``trtllm_*``
=========  ==========================  =============================================
"""

from __future__ import annotations

from dataclasses import dataclass

from kvtier.probes.polling import DEFAULT_HOST


@dataclass(frozen=True)
class EngineProfile:
    """Where an engine serves Prometheus text and which metric name prefixes matter."""

    engine: str
    default_url: str
    prefixes: tuple[str, ...]


PROFILES: dict[str, EngineProfile] = {p.engine: p for p in (
    EngineProfile("vllm", f"{DEFAULT_HOST}:8000/metrics", (
        "vllm:kv_offload_", "vllm:simple_kv_offload_", "vllm:prefix_cache_",
        "vllm:external_prefix_cache_", "vllm:prompt_tokens", "vllm:kv_cache_usage_perc",
        "vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds",
        "vllm:e2e_request_latency_seconds", "vllm:request_prefill_kv_computed_tokens",
        "vllm:num_requests_", "vllm:kv_block_", "vllm:lmcache_", "vllm:cache_config_info")),
    # LMCache inside vLLM (``lmcache:``) and its multi-process server's own page (``lmcache_mp_``)
    EngineProfile("lmcache", f"{DEFAULT_HOST}:6999/metrics", ("lmcache:", "lmcache_mp_")),
    EngineProfile("sglang", f"{DEFAULT_HOST}:30000/metrics", ("sglang:",)),
    # KVBM's page, a worker's system page and the frontend's
    EngineProfile("dynamo", f"{DEFAULT_HOST}:6880/metrics", (
        "kvbm_", "dynamo_component_", "dynamo_frontend_")),
    EngineProfile("trtllm", f"{DEFAULT_HOST}:8000/prometheus/metrics", ("trtllm_",)),
)}


def profile(engine: str) -> EngineProfile:
    try:
        return PROFILES[engine]
    except KeyError:
        raise ValueError(f"unknown engine {engine!r}; known: {', '.join(PROFILES)}") from None


def guess_profiles(text: str) -> tuple[str, ...]:
    """The profiles whose metric prefixes the exposition's series start with, the most
    matched first (a vLLM page with LMCache inside: ``("vllm", "lmcache")``); ``()`` when it
    has none of them."""
    names = [line.split("{", 1)[0].split(" ", 1)[0] for line in text.splitlines()
             if line and not line.startswith("#")]
    matched = {engine: sum(name.startswith(p.prefixes) for name in names)
               for engine, p in PROFILES.items()}
    return tuple(sorted((e for e, n in matched.items() if n), key=lambda e: -matched[e]))
