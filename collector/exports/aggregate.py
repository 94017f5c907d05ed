"""Running aggregates of ingested batches: the one source both exporters read.

``MetricsState.observe(batch)`` folds a batch into counters and fixed-bucket histograms with
vectorised numpy work (no per-event Python). Prometheus formats a ``snapshot()`` at scrape
time; the OTLP exporter sends the same snapshot as OTLP metrics, so the two never disagree.

Block events are labelled with the kind of source that reported them (:data:`SOURCES`, from
the batch's ``Origin.source``). Two sources of one engine can report the same movement: the
in-engine hooks and the engine's KV-event stream both see a store into the CPU tier, an
eviction from it and the cold tier's stores and evictions. Each movement is counted once:
once the collector has received hooks from an engine, those movements of that engine's KV
events go to ``block_events_reported`` only (what each source reported, duplicates
included), and the aggregate keeps the hooks' copy (which carries request ids and latencies).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kvtier.collector.batch import EventBatch
from kvtier.collector.events import Outcome, Tier

# Bucket upper bounds in seconds (Prometheus ``le``); +Inf is implied.
PROMOTION_BUCKETS_S = (25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025,
                       0.05, 0.1, 0.25, 0.5, 1.0)
TTFT_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 60.0)
ITL_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.035, 0.05, 0.1, 0.25, 0.5, 1.0)
NO_TIER = "none"
NO_CONFIG = "unknown"

_TIER_LABELS = [t.label for t in Tier]
_KIND_LABELS = [o.label for o in Outcome]
_PROMOTION_CODES = np.array([Outcome.CPU_PROMOTION, Outcome.COLD_PROMOTION])

# The ``source`` label: what kind of source reported an event, by the scheme that starts its
# Origin.source ("vllm-hooks:node-7:..." is the hooks); anything else is an in-process recorder.
SOURCES = {
    "hooks": "kvtier's in-engine plug-ins, shipped to `kvtier collect --hooks`",
    "kv_events": "the engine's own KV-event stream (vLLM or SGLang ZMQ, TensorRT-LLM HTTP)",
    "recorder": "a recorder in the collector's process (kvtier's reference engine, the load probe)",
}
_SCHEME_SOURCES = {"hooks": "hooks", "zmq": "kv_events", "http": "kv_events"}
# Movements the hooks report too: a store into, or an eviction from, the CPU or cold tier.
_BOTH_REPORT = {(Outcome.STORE, "tier_to"), (Outcome.EVICT, "tier_from")}
_OFF_GPU = np.array([Tier.CPU, Tier.COLD])


def source_label(source: str) -> str:
    """The :data:`SOURCES` entry of a batch whose ``Origin.source`` is ``source``."""
    scheme = source.split(":", 1)[0] if ":" in source else ""
    return _SCHEME_SOURCES.get(scheme.rsplit("-", 1)[-1], "recorder")


@dataclass
class HistogramState:
    """Counts per bucket (the last one is +Inf), a sum, and min/max of what was observed."""

    bounds_s: tuple[float, ...]
    counts: np.ndarray = None
    sum_s: float = 0.0
    min_s: float = float("inf")
    max_s: float = float("-inf")

    def __post_init__(self) -> None:
        if self.counts is None:
            self.counts = np.zeros(len(self.bounds_s) + 1, dtype=np.int64)

    def add(self, values_s: np.ndarray) -> None:
        if values_s.size == 0:
            return
        # side="left": a value equal to a bound counts in that bound's bucket (le semantics).
        index = np.searchsorted(np.asarray(self.bounds_s), values_s, side="left")
        self.counts += np.bincount(index, minlength=len(self.bounds_s) + 1)
        self.sum_s += float(values_s.sum())
        self.min_s = min(self.min_s, float(values_s.min()))
        self.max_s = max(self.max_s, float(values_s.max()))

    @property
    def count(self) -> int:
        return int(self.counts.sum())

    def copy(self) -> "HistogramState":
        return HistogramState(self.bounds_s, self.counts.copy(), self.sum_s, self.min_s, self.max_s)


@dataclass(frozen=True)
class MetricsSnapshot:
    """A consistent copy of the aggregates, keyed by label tuples (see ``MetricsState``)."""

    start_time_s: float
    time_s: float
    block_events: dict
    block_tokens: dict
    block_events_reported: dict
    recomputed_tokens: dict
    requests: dict
    promotion_s: dict
    ttft_s: dict
    itl_s: dict
    rejected_rows: dict


@dataclass
class MetricsState:
    """Aggregates since start. Keys:

    * ``block_events``/``block_tokens``: (kind, tier, engine, instance, source); ``tier`` is the
      tier a block was served from or left (``tier_from``), else the tier it went to, else
      "none"; ``source`` a :data:`SOURCES` key. A movement two sources report is counted once
      (see the module doc); ``block_events_reported`` has the same keys and counts every
      event as its source reported it.
    * ``promotion_s``: (tier_from, engine, instance) -> histogram of promotion latency.
    * ``ttft_s``/``itl_s``/``requests``: (tier_config, engine, instance).
    * ``recomputed_tokens``: (engine, instance), from request records.
    """

    clock: Callable[[], float] = time.time
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        self.start_time_s = self.clock()
        self.block_events: Counter = Counter()
        self.block_tokens: Counter = Counter()
        self.block_events_reported: Counter = Counter()
        self._hooked_engines: set[str] = set()  # engines whose hooks reached this collector
        self.recomputed_tokens: Counter = Counter()
        self.requests: Counter = Counter()
        self.rejected_rows: Counter = Counter()
        self.promotion_s: dict = {}
        self.ttft_s: dict = {}
        self.itl_s: dict = {}

    def observe(self, batch: EventBatch, result=None) -> None:
        """Fold a stored batch in. Signature fits ``Flusher(on_ingest=state.observe)``."""
        engine, instance = batch.origin.engine, batch.origin.instance
        source = source_label(batch.origin.source)
        events = _block_columns(batch.block_events)
        requests = _request_columns(batch.requests)
        with self._lock:
            if source == "hooks":
                self._hooked_engines.add(engine)
            self._observe_events(events, engine, instance, source)
            self._observe_requests(requests, engine, instance)
            for reason, count in batch.rejected.items():
                self.rejected_rows[(reason,)] += count

    def _observe_events(self, cols: dict, engine: str, instance: str, source: str) -> None:
        kind, tier_from, tier_to = cols["kind"], cols["tier_from"], cols["tier_to"]
        if kind.size == 0:
            return
        no_tier = len(_TIER_LABELS)
        tier = np.where(tier_from != no_tier, tier_from, tier_to)
        key = kind * (no_tier + 1) + tier
        size = len(_KIND_LABELS) * (no_tier + 1)
        counted = np.ones(kind.size, dtype=bool)
        if source == "kv_events" and engine in self._hooked_engines:
            counted = ~_reported_by_hooks_too(cols)
        reported = np.bincount(key, minlength=size)
        counts = np.bincount(key[counted], minlength=size)
        tokens = np.bincount(key[counted], weights=cols["tokens"][counted], minlength=size)
        tier_names = [*_TIER_LABELS, NO_TIER]
        for code in np.flatnonzero(reported):
            labels = (_KIND_LABELS[code // (no_tier + 1)], tier_names[code % (no_tier + 1)], engine,
                      instance, source)
            self.block_events_reported[labels] += int(reported[code])
            if counts[code]:
                self.block_events[labels] += int(counts[code])
                self.block_tokens[labels] += int(tokens[code])
        promoted = np.isin(kind, _PROMOTION_CODES) & ~np.isnan(cols["latency_s"])
        for tier_code in np.unique(tier_from[promoted]):
            values = cols["latency_s"][promoted & (tier_from == tier_code)]
            labels = (tier_names[tier_code], engine, instance)
            self.promotion_s.setdefault(labels, HistogramState(PROMOTION_BUCKETS_S)).add(values)

    def _observe_requests(self, cols: dict, engine: str, instance: str) -> None:
        if cols["tier_config_id"].size == 0:
            return
        self.recomputed_tokens[(engine, instance)] += int(np.nansum(cols["recomputed_tokens"]))
        for config in np.unique(cols["tier_config_id"]):
            chosen = cols["tier_config_id"] == config
            key = (str(config), engine, instance)
            self.requests[key] += int(chosen.sum())
            for values, store, bounds in ((cols["ttft_s"], self.ttft_s, TTFT_BUCKETS_S),
                                          (cols["itl_s"], self.itl_s, ITL_BUCKETS_S)):
                picked = values[chosen & ~np.isnan(values)]
                if picked.size:
                    store.setdefault(key, HistogramState(bounds)).add(picked)

    def snapshot(self) -> MetricsSnapshot:
        with self._lock:
            return MetricsSnapshot(
                self.start_time_s, self.clock(), dict(self.block_events), dict(self.block_tokens),
                dict(self.block_events_reported), dict(self.recomputed_tokens), dict(self.requests),
                {k: h.copy() for k, h in self.promotion_s.items()},
                {k: h.copy() for k, h in self.ttft_s.items()},
                {k: h.copy() for k, h in self.itl_s.items()},
                dict(self.rejected_rows),
            )


def _reported_by_hooks_too(cols: dict) -> np.ndarray:
    """Which rows are movements the in-engine hooks report as well (see the module doc)."""
    both = np.zeros(cols["kind"].size, dtype=bool)
    for kind, tier_column in _BOTH_REPORT:
        both |= (cols["kind"] == kind) & np.isin(cols[tier_column], _OFF_GPU)
    return both


def _labels(column: pa.ChunkedArray, missing: str) -> np.ndarray:
    values = pc.fill_null(pc.cast(column, pa.string()), missing)
    return np.asarray(values.to_numpy(zero_copy_only=False), dtype=object).astype(str)


def _floats(column: pa.ChunkedArray) -> np.ndarray:
    return pc.cast(column, pa.float64()).to_numpy(zero_copy_only=False).astype(np.float64)


def _codes(column: pa.ChunkedArray, labels: list[str]) -> np.ndarray:
    """Enum codes of a dictionary-encoded column (its position in ``labels``); nulls get
    ``len(labels)``. Works whatever order the column's own dictionary is in."""
    codes = np.full(len(column), len(labels), dtype=np.int64)
    offset = 0
    for chunk in column.chunks:
        if not pa.types.is_dictionary(chunk.type):
            chunk = chunk.dictionary_encode()
        lookup = np.array([labels.index(v) for v in chunk.dictionary.to_pylist()] + [len(labels)])
        indices = pc.fill_null(chunk.indices, len(lookup) - 1).to_numpy(zero_copy_only=False)
        codes[offset:offset + len(chunk)] = lookup[indices]
        offset += len(chunk)
    return codes


def _block_columns(table: pa.Table) -> dict:
    return {
        "kind": _codes(table.column("kind"), _KIND_LABELS),
        "tier_from": _codes(table.column("tier_from"), _TIER_LABELS),
        "tier_to": _codes(table.column("tier_to"), _TIER_LABELS),
        "tokens": np.nan_to_num(_floats(table.column("tokens"))),
        "latency_s": _floats(table.column("latency_s")),
    }


def _request_columns(table: pa.Table) -> dict:
    return {
        "tier_config_id": _labels(table.column("tier_config_id"), NO_CONFIG),
        "recomputed_tokens": _floats(table.column("recomputed_tokens")),
        "ttft_s": _floats(table.column("ttft_s")),
        "itl_s": _floats(table.column("itl_s")),
    }
