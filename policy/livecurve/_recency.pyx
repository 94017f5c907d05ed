# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The live curve's compiled kernel: exact LRU stack distances, online, per instance.

``RecencyStack`` keeps the most recent ``limit`` distinct blocks of one access stream: each
block's last access is a mark on a time line, a Fenwick tree counts the marks, and a block's
stack distance (1 + distinct blocks used since its last use) is the number of marks from its
own on. Marks past ``limit`` are dropped (a block that old misses at every size the curve
reports); when the time line fills it is compacted, so memory stays O(``limit``) and an
access costs O(log ``limit``), amortised.

``LiveKernel`` turns requests (prefix-chained block hashes, prompt tokens, block size) into
token counts per required capacity, under one engine's tier semantics:

* exclusive tiers (a block lives in one tier, victims move down, hits move up: kvtier's
  reference engine, SGLang HiCache, TensorRT-LLM with every priority offloaded): the tiers
  together are one LRU stack, so a prompt's block ``i`` is served at total capacity ``T``
  when the running maximum of the distances of blocks ``0..i`` is at most ``T`` (the prefix
  rule: reuse stops at the first block no tier holds);
* vLLM (copy-on-store CPU tier): the GPU block pool at its own size, as a stack released
  tail first (a cached block the request cannot take as a hit, the last full one, is
  computed into a second copy, the old one keeping its place); then the CPU tier and the
  file tier simulated at each ladder size (``_vllm_tiers.pxi``): vLLM offers a request's GPU
  hits to its CPU tier only when it loaded nothing, which depends on the size, so the CPU
  tier is no stack. A CPU stack over the blocks past the GPU hits (and the GPU hits of a
  request whose next block it does not hold) gives the sizes for a share of the hits: exact
  where the largest tracked size loads what each size does, an estimate elsewhere.

Each request is looked up against the state before it, then applied, as the simulator does.
"""

from libc.stdint cimport int8_t, int32_t, int64_t, uint64_t
from libc.stdlib cimport calloc, free, malloc, realloc
from libc.string cimport memset

import numpy as np

cdef int64_t FAR = 0x7fffffffffffffff  # the distance of a block the stack does not hold
cdef int64_t EMPTY = -1

cdef enum:
    SEM_EXCLUSIVE = 0
    SEM_VLLM = 1

EXCLUSIVE, VLLM = SEM_EXCLUSIVE, SEM_VLLM  # the semantics codes LiveKernel takes


cdef inline int64_t block_tokens_at(int64_t i, int64_t prompt, int64_t bt) noexcept nogil:
    cdef int64_t tok = prompt - i * bt
    return bt if tok > bt else (0 if tok < 0 else tok)


include "_block_ids.pxi"
include "_stack.pxi"
include "_vllm_tiers.pxi"


cdef class LiveKernel:
    """One instance's state (see the module doc). ``edges`` (ascending block counts) bound
    the bins :meth:`serve` counts tokens into: bin ``j`` holds the tokens whose required
    capacity is in ``(edges[j-1], edges[j]]``, the last bin those no size up to
    ``track_blocks`` serves. Under exclusive semantics the capacity is the tiers' total;
    under vLLM's it is the CPU tier's, beyond the GPU hits, and ``cpu_blocks[j]`` with
    ``file_blocks[j]`` (0: none) are the tier sizes simulated exactly. Every structure
    shares the instance's block ids: one table probe a block."""
    cdef readonly int semantics
    cdef readonly int64_t gpu_blocks
    cdef BlockIds ids
    cdef RecencyStack main
    cdef RecencyStack gpu
    cdef int64_t* edges
    cdef Py_ssize_t n_edges
    cdef list tiers
    cdef int32_t* request     # the request's block ids
    cdef int8_t* cached
    cdef int8_t* marks
    cdef int64_t* positions
    cdef int32_t* keys
    cdef int32_t* stored
    cdef int32_t* slots
    cdef Py_ssize_t room

    def __cinit__(self, int semantics, int64_t gpu_blocks, int64_t track_blocks,
                  const int64_t[:] edges, const int64_t[:] cpu_blocks=None,
                  const int64_t[:] file_blocks=None):
        cdef Py_ssize_t i
        if semantics != SEM_EXCLUSIVE and semantics != SEM_VLLM:
            raise ValueError(f"semantics must be {EXCLUSIVE} (exclusive) or {VLLM} (vllm), got {semantics}")
        if gpu_blocks < 0 or track_blocks < 1:
            raise ValueError(f"need gpu_blocks >= 0 and track_blocks >= 1, got {gpu_blocks}, {track_blocks}")
        self.semantics = semantics
        self.gpu_blocks = gpu_blocks
        self.ids = BlockIds()
        self.main = RecencyStack(track_blocks, self.ids)
        self.gpu = RecencyStack(2 * gpu_blocks + 4096, self.ids)
        self.n_edges = edges.shape[0]
        self.edges = <int64_t*> malloc(max(1, self.n_edges) * sizeof(int64_t))
        for i in range(self.n_edges):
            if i and edges[i] <= edges[i - 1]:
                raise ValueError("edges must be strictly ascending")
            self.edges[i] = edges[i]
        self.tiers = []
        if cpu_blocks is not None and semantics == SEM_VLLM:
            for i in range(cpu_blocks.shape[0]):
                self.tiers.append(VllmCpuTier(cpu_blocks[i], self.ids,
                                              file_blocks[i] if file_blocks is not None else 0))
        self.room = 0
        self.request = self.keys = self.stored = self.slots = NULL
        self.cached = self.marks = NULL
        self.positions = NULL

    def __dealloc__(self):
        free(self.edges)
        free(self.request)
        free(self.cached)
        free(self.marks)
        free(self.positions)
        free(self.keys)
        free(self.stored)
        free(self.slots)

    @property
    def bins(self) -> int:
        return self.n_edges + 1

    def nbytes(self) -> int:
        """Bytes the kernel holds (its ids, tables, trees and simulated tiers)."""
        cdef VllmCpuTier tier
        total = (self.ids.nbytes() + self.main.nbytes() + self.gpu.nbytes() + self.n_edges * 8
                 + self.room * 26)
        for tier in self.tiers:
            total += tier.nbytes()
        return total

    @property
    def tracked_blocks(self) -> int:
        return self.main.live

    @property
    def held_blocks(self) -> int:
        """Blocks some structure holds (the ids alive)."""
        return self.ids.held

    def holds(self, Py_ssize_t pair, uint64_t block) -> tuple:
        """Whether the simulated vLLM tier pair ``pair`` holds ``block``: (CPU, file)."""
        cdef VllmCpuTier tier = <VllmCpuTier> self.tiers[pair]
        cdef int32_t k = self.ids.find(block)
        if k < 0:
            return (False, False)
        return (tier.holds(k), tier.files is not None and tier.files.holds(k))

    cdef inline Py_ssize_t bin_of(self, int64_t d) noexcept nogil:
        cdef Py_ssize_t lo = 0, hi = self.n_edges, mid
        while lo < hi:  # the first edge >= d
            mid = (lo + hi) >> 1
            if self.edges[mid] < d:
                lo = mid + 1
            else:
                hi = mid
        return lo

    cdef int _scratch(self, Py_ssize_t n) except -1:
        if n > self.room:
            self.room = max(n, 2 * self.room, 256)
            self.request = <int32_t*> grown(self.request, self.room, sizeof(int32_t))
            self.cached = <int8_t*> grown(self.cached, self.room, sizeof(int8_t))
            self.marks = <int8_t*> grown(self.marks, self.room, sizeof(int8_t))
            self.positions = <int64_t*> grown(self.positions, self.room, sizeof(int64_t))
            self.keys = <int32_t*> grown(self.keys, self.room, sizeof(int32_t))
            self.stored = <int32_t*> grown(self.stored, self.room, sizeof(int32_t))
            self.slots = <int32_t*> grown(self.slots, self.room, sizeof(int32_t))
        return 0

    cdef int _pin(self, const uint64_t* h, Py_ssize_t nb) except -1:
        """The request's ids, held until :meth:`_unpin` (nothing frees them meanwhile), and
        every structure's arrays grown to the ids there are."""
        cdef Py_ssize_t i, k
        cdef int64_t room = self.ids.room
        for i in range(nb):
            self.request[i] = self.ids.pinned(h[i])
        if self.ids.room != room or self.main.n_stamp < room:
            self.main.reserve()
            self.gpu.reserve()
        return 0

    cdef void _unpin(self, Py_ssize_t nb) noexcept nogil:
        cdef Py_ssize_t i
        for i in range(nb):
            self.ids.release(self.request[i])

    def serve(self, const uint64_t[:] hashes, const int64_t[:] offsets, const int64_t[:] prompt,
              const int64_t[:] block_tokens, int64_t[:] hist, int64_t[:] tier_hits,
              int64_t[:] totals):
        """Requests ``r`` = ``hashes[offsets[r]:offsets[r + 1]]`` in order: tokens added to
        ``hist`` (one entry per bin), tokens each simulated vLLM tier pair serves past the GPU
        to ``tier_hits``, and ``totals`` += [requests, prompt tokens, tokens the GPU alone serves,
        block references]."""
        cdef Py_ssize_t r, nb, n = prompt.shape[0]
        if hist.shape[0] != self.n_edges + 1 or totals.shape[0] < 4:
            raise ValueError(f"hist needs {self.n_edges + 1} entries and totals 4")
        if offsets.shape[0] != n + 1 or block_tokens.shape[0] != n:
            raise ValueError("offsets need one entry per request plus one; block_tokens one each")
        if tier_hits.shape[0] < len(self.tiers):
            raise ValueError(f"tier_hits needs {len(self.tiers)} entries")
        for r in range(n):
            nb = offsets[r + 1] - offsets[r]
            self._scratch(nb + 1)
            if nb:
                self._pin(&hashes[offsets[r]], nb)
            if self.semantics == SEM_EXCLUSIVE:
                totals[2] += self._exclusive(self.request, nb, prompt[r], block_tokens[r], hist)
            else:
                totals[2] += self._vllm(self.request, nb, prompt[r], block_tokens[r], hist,
                                        tier_hits)
            self._unpin(nb)
            totals[0] += 1
            totals[1] += prompt[r]
            totals[3] += nb

    cdef int64_t _exclusive(self, const int32_t* h, Py_ssize_t nb, int64_t prompt, int64_t bt,
                            int64_t[:] hist) except -1:
        """The tiers' stack, and the GPU's own (the GPU alone: its chain is shorter, so it
        pins other blocks first); returns the tokens the GPU alone serves."""
        cdef Py_ssize_t i, b = 0
        cdef int64_t d, most = 0, gpu_tokens = 0
        for i in range(nb):
            d = self.main.distance(h[i])
            if d > most:
                most = d
                b = self.bin_of(d)
            hist[b] += block_tokens_at(i, prompt, bt)
            # the engine pins the GPU's hits in the chain before it promotes or computes the
            # rest; the chain is taken at the largest size tracked
            self.cached[i] = d <= self.gpu_blocks and most != FAR
        self._pinned_first(self.main, h, nb, self.cached)
        most = 0
        for i in range(nb):
            d = self.gpu.distance(h[i])
            most = d if d > most else most
            self.cached[i] = most <= self.gpu_blocks
            if self.cached[i]:
                gpu_tokens += block_tokens_at(i, prompt, bt)
        self._pinned_first(self.gpu, h, nb, self.cached)
        return gpu_tokens

    cdef int _pinned_first(self, RecencyStack stack, const int32_t* h, Py_ssize_t nb,
                           const int8_t* pinned) except -1:
        cdef Py_ssize_t i
        for i in range(nb):
            if pinned[i]:
                stack.access(h[i])
        for i in range(nb):
            if not pinned[i]:
                stack.access(h[i])
        return 0

    cdef int64_t _vllm(self, const int32_t* h, Py_ssize_t nb, int64_t prompt, int64_t bt,
                       int64_t[:] hist, int64_t[:] tier_hits) except -1:
        cdef Py_ssize_t i, g = 0, b = 0, k, first = 0
        cdef Py_ssize_t cacheable = max(0, min(nb, prompt // bt))
        cdef Py_ssize_t gpu_limit = max(0, min(nb, (prompt - 1) // bt))
        cdef int64_t d, most = 0, gpu_tokens = 0
        cdef VllmCpuTier tier
        while g < gpu_limit and self.gpu.distance(h[g]) <= self.gpu_blocks:
            gpu_tokens += block_tokens_at(g, prompt, bt)
            g += 1
        for i in range(g, cacheable):
            self.cached[i - g] = self.gpu.distance(h[i]) <= self.gpu_blocks
            d = self.main.distance(h[i])
            if d > most:
                most = d
                b = self.bin_of(d)
            hist[b] += block_tokens_at(i, prompt, bt)
        for k in range(len(self.tiers)):
            tier = <VllmCpuTier> self.tiers[k]
            tier_hits[k] += tier.serve(h, g, cacheable, prompt, bt, self.marks, self.positions,
                                       self.keys, self.stored, self.slots)
        if g == cacheable or self.main.distance(h[g]) == FAR:
            first = 0  # it loads nothing at the largest size: its GPU hits are offered too
        else:
            first = g
        for i in range(cacheable - 1, -1, -1):  # released tail first: block 0 the newest
            if i >= g and self.cached[i - g]:
                self.gpu.copy(h[i])
            else:
                self.gpu.access(h[i])
        for i in range(cacheable - 1, first - 1, -1):  # the CPU's recency, once, tail first
            self.main.access(h[i])
        return gpu_tokens
