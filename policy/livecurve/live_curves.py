"""The collector's live what-if curves: every instance's hit ratio at a ladder of tier sizes,
kept at ingest from the batches the collector stores.

Method (exact, no sampling; ``_recency.pyx``): under exclusive tiers, LRU stack distances
over a Fenwick tree of each instance's access times, the prefix rule applied per request as
Tair's KVCM optimizer does (one stack serves every size, and the GPU its own); under vLLM's
semantics, its GPU block pool as a stack and its CPU (and file) tier simulated at each
ladder size, since vLLM offers a request's GPU hits to the CPU tier only when it loaded
nothing, which depends on the size. Error against the simulator's offline replay of the
same store at each ladder size (``kvtier simulate --trace STORE --gpu-tokens G --cpu-tokens
C``): 0.0 points of token hit ratio measured on the demo's store, a synthetic fleet of 64
instances (both semantics, with a file tier) and the Mooncake trace (the tests hold it under
the stated bound, 1 point). It can differ where the replay's order is not the collector's:
a request received after requests that arrived ``reorder_s`` later is replayed late; under
exclusive tiers a request whose prefix chain is shorter at a size than at the largest one
pins its GPU hits in another order; a request larger than a tier. The sizes for a share of
the reachable hits are bin edges (at most 4.4% above the exact size); under vLLM they come
from a CPU stack that loads as the largest tracked size does (an estimate below it).
Memory per instance: its structures share one table of block ids and index plain arrays
by id; they hold the GPU and the largest size asked, about 100 bytes a block tracked under
exclusive tiers and 200 under vLLM's (its eight simulated sizes), plus the windows' counts
(12 MB for a vLLM instance tracking 57k blocks in ``benchmarks/live_curves.py``, which
measures it, and the ingest rate with curves beside without).

:class:`LiveCurves` is the service's ingest observer (``CollectorService(observers=...)``):
``observe`` runs on the ingest path and costs a whole-column pass and the kernel's per-block
work; ``refresh`` (the service's own thread) turns the counts into values, which ``samples``
(``/metrics``) and ``export`` (the file beside the segments) only read.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow.compute as pc

from kvtier.collector.batch import EventBatch
from kvtier.policy.cost import CostParams, measured_cost_params
from kvtier.policy.geometry import DEFAULT_GEOMETRY, geometry, geometry_for
from kvtier.policy.gpu_capacity import METRIC, published_gpu
from kvtier.policy.livecurve.config import CurveConfig, semantics_of
from kvtier.policy.livecurve.curve_values import CurveFile, InstanceCurves, write_curve_file
from kvtier.policy.livecurve.instance_curve import InstanceCurve
from kvtier.policy.livecurve.request_stream import ArrivalOrder, LookupBuffer, requests_of
from kvtier.policy.livecurve.window_values import instance_values

log = logging.getLogger(__name__)
KV_BYTES_ENOUGH_TOKENS = 1 << 20  # the KV bytes per token are read off this many tokens' events
NO_GPU = ("no GPU size yet: give kvtier collect --curve-gpu-tokens (or NAME=TOKENS), or "
          "--scrape the engine's /metrics (vLLM publishes vllm:cache_config_info)")


class LiveCurves:
    """Every instance's curve (by engine and instance), with ``config``; ``collector`` names
    this collector's file; ``cost_file`` (``kvtier calibrate --out``) prices the gains and
    the headroom, else kvtier's defaults do (and the values say so). ``clock``: Unix seconds."""

    def __init__(self, config: CurveConfig, *, collector: str, cost_file: Path | None = None,
                 clock: Callable[[], float] = time.time):
        self.config, self.collector, self.clock = config, collector, clock
        self.params = measured_cost_params(cost_file) if cost_file else CostParams()
        self.costs = "calibrated" if cost_file else "default"
        self._lock = threading.Lock()
        self._curves: dict[tuple[str, str], InstanceCurve] = {}
        self._orders: dict[tuple[str, str], ArrivalOrder] = {}
        self._lookups = LookupBuffer()
        self._published: dict[str, tuple[int, int]] = {}  # instance -> (GPU tokens, block size)
        self._kv_bytes: dict[tuple[str, str], list[int]] = {}  # -> [bytes, tokens] measured
        self.unsized_requests: dict[tuple[str, str], int] = {}
        self._file = CurveFile(collector, clock(), ())

    # ------------------------------------------------------------ the ingest path

    def observe(self, batch: EventBatch) -> None:
        """Fold a stored batch in (the service calls it after each write)."""
        key = (batch.origin.engine, batch.origin.instance)
        now = self.clock()
        with self._lock:
            self._note_gpu(batch)
            self._note_kv_bytes(key, batch)
            requests = requests_of(batch, self._lookups)
            if len(requests):
                order = self._orders.setdefault(key, ArrivalOrder(self.config.reorder_s))
                order.add(requests, now)
                self._serve(key, order.release(), now)

    def _serve(self, key: tuple[str, str], requests, now: float) -> None:
        if not len(requests):
            return
        curve = self._curves.get(key)
        if curve is None:
            curve = self._start(key, int(requests.block_tokens[0]), now)
            if curve is None:
                self.unsized_requests[key] = self.unsized_requests.get(key, 0) + len(requests)
                return
        same = requests.block_tokens == curve.block_tokens
        if not same.all():  # an instance's block size does not change while it serves
            requests = requests.take(np.flatnonzero(same))
        curve.serve(requests, now)

    def _start(self, key: tuple[str, str], block_tokens: int, now: float) -> InstanceCurve | None:
        gpu_tokens, _ = self._gpu(key)
        if gpu_tokens is None:
            return None
        curve = self._curves[key] = InstanceCurve(*key, self.config, gpu_tokens, block_tokens, now)
        return curve

    def _gpu(self, key: tuple[str, str]) -> tuple[int | None, str]:
        instance = key[1]
        if instance in dict(self.config.gpu_tokens_by_instance):
            return self.config.gpu_tokens_of(instance), "given"
        if instance in self._published:
            return self._published[instance][0], f"published by the engine ({METRIC})"
        if self.config.gpu_tokens is not None:
            return self.config.gpu_tokens, "given"
        return None, "none"

    def _note_gpu(self, batch: EventBatch) -> None:
        table = batch.metric_intervals
        if table.num_rows == 0:
            return
        rows = table.filter(pc.equal(table.column("metric"), METRIC))
        if rows.num_rows:
            found = published_gpu(rows.column("labels")[-1].as_py(), "scraped")
            if found is not None:
                self._published[batch.origin.instance] = (found.tokens, found.block_tokens)

    def _note_kv_bytes(self, key: tuple[str, str], batch: EventBatch) -> None:
        table = batch.block_events
        seen = self._kv_bytes.get(key)
        if table.num_rows == 0 or (seen is not None and seen[1] >= KV_BYTES_ENOUGH_TOKENS):
            return  # an engine's KV geometry does not change while it serves
        size, tokens = table.column("size_bytes"), table.column("tokens")
        both = pc.and_(pc.is_valid(size), pc.is_valid(tokens))
        total_tokens = pc.sum(pc.filter(tokens, both)).as_py() or 0
        if total_tokens > 0:
            seen = self._kv_bytes.setdefault(key, [0, 0])
            seen[0] += pc.sum(pc.filter(size, both)).as_py()
            seen[1] += total_tokens

    # ------------------------------------------------------------ off the ingest path

    def flush(self) -> None:
        """Replay every request still held for ordering (at stop, and in tests)."""
        now = self.clock()
        with self._lock:
            for key, order in self._orders.items():
                self._serve(key, order.release(everything=True), now)

    def refresh(self) -> CurveFile:
        """Release the requests of quiet instances and turn the counts into values."""
        now = self.clock()
        windows = [*self.config.windows_s, None]
        with self._lock:
            for key, order in self._orders.items():
                self._serve(key, order.release(now), now)
            taken = [(key, curve, [curve.window_counts(now, w) for w in windows],
                      curve.recent.latest(), curve.memory_bytes)
                     for key, curve in sorted(self._curves.items())]
            unsized = {k: n for k, n in self.unsized_requests.items() if k not in self._curves}
            kv_bytes = {k: tuple(v) for k, v in self._kv_bytes.items()}
        instances = [instance_values(curve, counts, windows, recent, memory,
                                     self._params_for(kv_bytes.get(key)),
                                     self._gpu(key)[1])
                     for key, curve, counts, recent, memory in taken]
        instances += [InstanceCurves(*key, semantics_of(key[0]), None, "none", None, None,
                                     "none", note=NO_GPU, unsized_requests=count)
                      for key, count in sorted(unsized.items())]
        self._file = CurveFile(self.collector, now, tuple(instances))
        return self._file

    def _params_for(self, kv_bytes: tuple[int, int] | None) -> tuple[CostParams, str, int, str]:
        """The cost model with the instance's KV bytes per token, and that figure's source."""
        if kv_bytes and kv_bytes[1] and round(kv_bytes[0] / kv_bytes[1]) > 0:
            per_token, source = int(round(kv_bytes[0] / kv_bytes[1])), "measured"
        elif self.config.kv_bytes_per_token:
            per_token, source = self.config.kv_bytes_per_token, "given"
        else:
            per_token, source = geometry(DEFAULT_GEOMETRY).bytes_per_token, "default"
        model = geometry_for(per_token + per_token % 2, source=source)  # a key and a value: even
        return replace(self.params, model=model), self.costs, per_token, source

    def snapshot(self) -> CurveFile:
        """The values of the last :meth:`refresh`."""
        return self._file

    def export(self, segments: Path) -> Path:
        """Write the last values beside the segments (see ``curve_values``)."""
        return write_curve_file(segments, self._file)

    def samples(self) -> Iterable:
        from kvtier.policy.livecurve.curve_metrics import curve_samples

        return curve_samples(self._file)
