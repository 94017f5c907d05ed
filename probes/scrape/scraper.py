"""Metric scrapers: one HTTP scraper, one profile per engine saying where and what to read.

Profiles (metric names from vLLM 0.33.0 ``vllm/v1/metrics/loggers.py``, TensorRT-LLM
``tensorrt_llm/metrics/collector.py``, SGLang's ``metrics_collector.py``, LMCache's
``docs/source/production/observability/metrics.rst`` at ``cce4a08`` and Dynamo's
``prometheus_names.rs`` at ``628d4ec``):

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

:class:`MetricScraper` turns each scrape after the first into a
:class:`kvtier.probes.scrape.intervals.ScrapeInterval` handed to ``on_interval``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable

from kvtier.probes.scrape.intervals import ScrapeInterval, Snapshot, interval_between, parse_snapshot
from kvtier.probes.polling import DEFAULT_HOST, FetchError, PollLoop, fetch

log = logging.getLogger(__name__)


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


@dataclass(frozen=True)
class ScraperConfig:
    """``url`` defaults to the engine's usual loopback endpoint. ``also`` names further
    profiles whose families are kept too (LMCache's, served by the vLLM process it runs in)."""

    engine: str
    url: str | None = None
    instance: str = "local"
    interval_s: float = 10.0
    timeout_s: float = 5.0
    also: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for engine in (self.engine, *self.also):
            profile(engine)
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"url must be http(s), got {self.url!r}")
        for name in ("interval_s", "timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")

    @property
    def endpoint(self) -> str:
        return self.url or profile(self.engine).default_url

    @property
    def prefixes(self) -> tuple[str, ...]:
        return tuple(p for engine in (self.engine, *self.also) for p in profile(engine).prefixes)


@dataclass
class ScrapeStats:
    scrapes: int = 0
    intervals: int = 0
    fetch_errors: int = 0
    parse_errors: int = 0
    callback_errors: int = 0


class MetricScraper:
    """GET the engine's metrics each round; hand the interval since the last good scrape to
    ``on_interval``. A failed scrape leaves the baseline where it was, so the next interval
    spans the gap (increases are not lost, only less finely placed in time)."""

    def __init__(self, config: ScraperConfig, on_interval: Callable[[ScrapeInterval], None], *,
                 clock: Callable[[], float] = time.time):
        self.config, self._on_interval, self._clock = config, on_interval, clock
        self._prefixes = config.prefixes
        self._last: Snapshot | None = None
        self.stats = ScrapeStats()
        self._loop = PollLoop(self.poll, config.interval_s, f"kvtier-scrape-{config.engine}")
        self.start, self.stop = self._loop.start, self._loop.stop

    def poll(self) -> ScrapeInterval | None:
        """One scrape; the new interval, or ``None`` (first scrape, or a failure). Never raises."""
        self.stats.scrapes += 1
        try:
            body = fetch(self.config.endpoint, timeout_s=self.config.timeout_s)
        except FetchError as exc:
            self.stats.fetch_errors += 1
            log.warning("scrape of %s failed: %s", self.config.endpoint, exc)
            return None
        return self.ingest_text(body.decode("utf-8", errors="replace"))

    def ingest_text(self, text: str) -> ScrapeInterval | None:
        """Use exposition text obtained elsewhere (a file, a multiprocess registry)."""
        try:
            snapshot = parse_snapshot(text, self._clock(), self._prefixes)
        except (ValueError, TypeError, IndexError, KeyError) as exc:
            self.stats.parse_errors += 1
            log.warning("unparseable metrics from %s: %s", self.config.endpoint, exc)
            return None
        before, self._last = self._last, snapshot
        if before is None:
            return None
        interval = interval_between(before, snapshot, self.config.engine, self.config.instance)
        self.stats.intervals += 1
        try:
            self._on_interval(interval)
        except Exception:
            self.stats.callback_errors += 1
            log.exception("scraper %s: on_interval failed", self.config.engine)
        return interval
