"""One instance's live curve: the compiled kernel and its sliding windows.

Requests are served by the kernel (``_recency.pyx``) into token counts per required capacity
bin; the counts go to the bucket of the collector's clock they arrived in (a ring covering
the longest window) and to the totals since start. A window's curve is the sum of its
buckets: at each ladder size, the prompt tokens every tier together would have served over
the prompt tokens of its requests.

Exclusive tiers are one stack: the bins are the ladder's sizes (exact there, as the
tiers' total: a CPU size ``c`` is the edge ``gpu + c``) and 16 per octave beyond the GPU (for
the sizes that reach a share of the hits). Under vLLM the kernel simulates the CPU (and
file) tier at each ladder size, and the bins (the CPU tier's own size) give the reach only.
"""

from __future__ import annotations

import math

import numpy as np

from kvtier.policy.livecurve._recency import EXCLUSIVE, VLLM, LiveKernel
from kvtier.policy.livecurve.config import BINS_PER_OCTAVE, CurveConfig, semantics_of
from kvtier.policy.livecurve.request_stream import Requests

TOTALS = ("requests", "prompt_tokens", "gpu_tokens", "block_refs")


def fine_edges(limit_blocks: int) -> list[int]:
    """1, then sizes 2^(1/16) apart, up to ``limit_blocks``."""
    steps = int(math.ceil(math.log2(max(limit_blocks, 1)) * BINS_PER_OCTAVE))
    return sorted({min(limit_blocks, int(math.ceil(2 ** (j / BINS_PER_OCTAVE))))
                   for j in range(steps + 1)})


FIELDS = ("hist", "tiers", "totals", "split")


class Counts:
    """Token counts of one span: per bin, per simulated vLLM tier pair (served past the
    GPU), the kernel's totals and the engine's measured split (GPU, CPU, cold, recomputed,
    prompt) of requests that have one."""

    def __init__(self, bins: int, tiers: int):
        self.hist = np.zeros(bins, dtype=np.int64)
        self.tiers = np.zeros(max(tiers, 1), dtype=np.int64)
        self.totals = np.zeros(4, dtype=np.int64)
        self.split = np.zeros(5, dtype=np.int64)

    def add(self, other: "Counts") -> None:
        for name in FIELDS:
            getattr(self, name).__iadd__(getattr(other, name))

    def clear(self) -> None:
        for name in FIELDS:
            getattr(self, name)[:] = 0

    def copy(self) -> "Counts":
        out = Counts(len(self.hist), len(self.tiers))
        out.add(self)
        return out


class InstanceCurve:
    """The curve of one (engine, instance) whose GPU holds ``gpu_tokens`` in blocks of
    ``block_tokens``. Not thread-safe: the owner (:class:`LiveCurves`) locks."""

    def __init__(self, engine: str, instance: str, config: CurveConfig, gpu_tokens: int,
                 block_tokens: int, started_s: float):
        self.engine, self.instance, self.config = engine, instance, config
        self.semantics = semantics_of(engine)
        self.block_tokens = block_tokens
        self.gpu_tokens = gpu_tokens
        self.gpu_blocks = gpu_tokens // block_tokens
        self.cpu_blocks = [t // block_tokens for t in config.cpu_ladder_tokens]
        self.cold_blocks = [t // block_tokens for t in config.cold_ladder_tokens]
        self.cold_above_blocks = config.cold_above_cpu_tokens // block_tokens
        track = -(-config.track_tokens // block_tokens)
        self.simulated: list[tuple[int, int]] = []  # vLLM: (CPU, file) blocks per tier pair
        if self.semantics == "vllm":
            self.base = 0  # vLLM's bins are the CPU tier's size
            ladder = set(self.cpu_blocks)
            kernel_track = track
            self.simulated = [(c, 0) for c in self.cpu_blocks if c > 0]
            if self.cold_blocks and self.cold_above_blocks not in self.cpu_blocks:
                self.simulated.append((self.cold_above_blocks, 0))  # what the files add to
            self.simulated += [(self.cold_above_blocks, k) for k in self.cold_blocks]
        else:
            self.base = self.gpu_blocks  # exclusive: the tiers' total
            ladder = {self.gpu_blocks + c for c in [*self.cpu_blocks, self.cold_above_blocks]}
            ladder |= {self.gpu_blocks + self.cold_above_blocks + k for k in self.cold_blocks}
            kernel_track = self.gpu_blocks + track
        self.edges = np.array(sorted(ladder | {self.base + e for e in fine_edges(track)}),
                              dtype=np.int64)
        pairs = np.array(self.simulated or [(0, 0)], dtype=np.int64)
        self.kernel = LiveKernel(VLLM if self.semantics == "vllm" else EXCLUSIVE, self.gpu_blocks,
                                 kernel_track, self.edges, pairs[:, 0].copy() if self.simulated
                                 else None, pairs[:, 1].copy())
        self.started_s = started_s
        slots = int(math.ceil(max(config.windows_s) / config.bucket_s)) + 1
        self._ring = [Counts(self.kernel.bins, len(self.simulated)) for _ in range(slots)]
        self._ring_ids = np.full(slots, -1, dtype=np.int64)
        self.total = Counts(self.kernel.bins, len(self.simulated))
        self.recent = RecentRequests(config.headroom_requests)

    def serve(self, requests: Requests, now_s: float) -> None:
        """Replay ``requests`` (in order) and count them in the bucket of ``now_s``."""
        if not len(requests):
            return
        counts = Counts(self.kernel.bins, len(self.simulated))
        self.kernel.serve(requests.hashes, requests.offsets, requests.prompt_tokens,
                          requests.block_tokens, counts.hist, counts.tiers, counts.totals)
        measured = requests.split[:, 0] >= 0
        counts.split[:4] = np.maximum(requests.split[measured], 0).sum(axis=0)
        counts.split[4] = requests.prompt_tokens[measured].sum()
        self.recent.add(requests)
        self._bucket(now_s).add(counts)
        self.total.add(counts)

    def _bucket(self, now_s: float) -> Counts:
        bucket = int(now_s // self.config.bucket_s)
        slot = bucket % len(self._ring)
        if self._ring_ids[slot] != bucket:
            self._ring[slot].clear()
            self._ring_ids[slot] = bucket
        return self._ring[slot]

    def window_counts(self, now_s: float, window_s: float | None) -> tuple[Counts, float]:
        """The counts of the last ``window_s`` (``None``: since start) and the seconds they
        span (the window, or less when the curve started within it)."""
        if window_s is None:
            return self.total.copy(), max(now_s - self.started_s, self.config.bucket_s)
        newest = int(now_s // self.config.bucket_s)
        first = newest - int(math.ceil(window_s / self.config.bucket_s)) + 1
        out = Counts(self.kernel.bins, len(self.simulated))
        for slot, bucket in enumerate(self._ring_ids.tolist()):
            if first <= bucket <= newest:
                out.add(self._ring[slot])
        return out, max(min(window_s, now_s - self.started_s), self.config.bucket_s)

    def served_tokens(self, counts: Counts, tier: str, size_blocks: int) -> int:
        """Prompt tokens every tier together serves with ``tier`` at ``size_blocks``."""
        if self.semantics == "vllm":
            pair = (self.cold_above_blocks, size_blocks) if tier == "cold" else (size_blocks, 0)
            if pair[0] == 0:
                return int(counts.totals[2])  # no CPU tier: the GPU alone
            return int(counts.totals[2] + counts.tiers[self.simulated.index(pair)])
        if tier == "cpu" and size_blocks == 0:
            return int(counts.totals[2])  # the GPU alone (its own stack)
        cumulative = np.cumsum(counts.hist)
        capacity = self.base + size_blocks + (self.cold_above_blocks if tier == "cold" else 0)
        return int(cumulative[self._edge(capacity)])

    def reach_blocks(self, counts: Counts, share: float) -> tuple[int, int]:
        """(the CPU size in blocks that serves ``share`` of the hits a CPU tier up to the
        tracked size adds, those reachable hit tokens)."""
        beyond = np.cumsum(counts.hist[:-1])
        gpu_part = beyond[self._edge(self.base)] if self.semantics != "vllm" else 0
        reachable = int(beyond[-1] - gpu_part) if len(beyond) else 0
        if reachable <= 0:
            return 0, 0
        index = int(np.searchsorted(beyond - gpu_part, share * reachable, side="left"))
        return int(self.edges[min(index, len(self.edges) - 1)]) - self.base, reachable

    def _edge(self, capacity: int) -> int:
        return int(np.searchsorted(self.edges, capacity, side="left"))

    @property
    def memory_bytes(self) -> int:
        counts = sum(c.hist.nbytes + c.tiers.nbytes + 72 for c in self._ring)
        return self.kernel.nbytes() + counts + self.recent.nbytes


class RecentRequests:
    """The latest requests with a measured tier split (arrival, prompt and per-tier tokens),
    for the headroom signal: a ring of ``limit``."""

    def __init__(self, limit: int):
        self.rows = np.zeros((limit, 6), dtype=np.float64)
        self.count = 0

    def add(self, requests: Requests) -> None:
        measured = requests.split[:, 0] >= 0
        if not measured.any():
            return
        rows = np.column_stack([requests.arrival_s[measured], requests.prompt_tokens[measured],
                                np.maximum(requests.split[measured], 0)])[-len(self.rows):]
        slots = (self.count + np.arange(len(rows))) % len(self.rows)
        self.rows[slots] = rows
        self.count += len(rows)

    def latest(self) -> np.ndarray:
        """Rows (arrival_s, prompt, gpu, cpu, cold, recomputed) in arrival order."""
        rows = self.rows[:min(self.count, len(self.rows))]
        return rows[np.argsort(rows[:, 0], kind="stable")]

    @property
    def nbytes(self) -> int:
        return self.rows.nbytes
