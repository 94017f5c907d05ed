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

from libc.stdint cimport int8_t, int64_t, uint64_t
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


include "_stack.pxi"
include "_vllm_tiers.pxi"


cdef class LiveKernel:
    """One instance's state (see the module doc). ``edges`` (ascending block counts) bound
    the bins :meth:`serve` counts tokens into: bin ``j`` holds the tokens whose required
    capacity is in ``(edges[j-1], edges[j]]``, the last bin those no size up to
    ``track_blocks`` serves. Under exclusive semantics the capacity is the tiers' total;
    under vLLM's it is the CPU tier's, beyond the GPU hits, and ``cpu_blocks[j]`` with
    ``file_blocks[j]`` (0: none) are the tier sizes simulated exactly."""
    cdef readonly int semantics
    cdef readonly int64_t gpu_blocks
    cdef RecencyStack main
    cdef RecencyStack gpu
    cdef int64_t* edges
    cdef Py_ssize_t n_edges
    cdef list tiers
    cdef int8_t* cached
    cdef int8_t* marks
    cdef int64_t* positions
    cdef uint64_t* keys
    cdef uint64_t* stored
    cdef int64_t* nodes
    cdef int64_t* slots
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
        self.main = RecencyStack(track_blocks)
        self.gpu = RecencyStack(2 * gpu_blocks + 4096)
        self.n_edges = edges.shape[0]
        self.edges = <int64_t*> malloc(max(1, self.n_edges) * sizeof(int64_t))
        for i in range(self.n_edges):
            if i and edges[i] <= edges[i - 1]:
                raise ValueError("edges must be strictly ascending")
            self.edges[i] = edges[i]
        self.tiers = []
        if cpu_blocks is not None and semantics == SEM_VLLM:
            for i in range(cpu_blocks.shape[0]):
                self.tiers.append(VllmCpuTier(cpu_blocks[i], file_blocks[i] if file_blocks is not None else 0))
        self.room = 0
        self.cached = NULL
        self.marks = NULL
        self.positions = NULL
        self.keys = NULL
        self.stored = NULL
        self.nodes = NULL
        self.slots = NULL

    def __dealloc__(self):
        free(self.edges)
        free(self.cached)
        free(self.marks)
        free(self.positions)
        free(self.keys)
        free(self.stored)
        free(self.nodes)
        free(self.slots)

    @property
    def bins(self) -> int:
        return self.n_edges + 1

    def nbytes(self) -> int:
        """Bytes the kernel holds (its tables, trees and simulated tiers)."""
        cdef VllmCpuTier tier
        total = self.main.nbytes() + self.gpu.nbytes() + self.n_edges * 8 + self.room * 42
        for tier in self.tiers:
            total += tier.nbytes()
        return total

    @property
    def tracked_blocks(self) -> int:
        return self.main.live

    def holds(self, Py_ssize_t pair, uint64_t block) -> tuple:
        """Whether the simulated vLLM tier pair ``pair`` holds ``block``: (CPU, file)."""
        cdef VllmCpuTier tier = <VllmCpuTier> self.tiers[pair]
        return (tier.holds(block), tier.files is not None and tier.files.holds(block))

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
            free(self.cached)
            free(self.marks)
            free(self.positions)
            free(self.keys)
            free(self.stored)
            free(self.nodes)
            free(self.slots)
            self.room = max(n, 2 * self.room, 256)
            self.cached = <int8_t*> malloc(self.room * sizeof(int8_t))
            self.marks = <int8_t*> malloc(self.room * sizeof(int8_t))
            self.positions = <int64_t*> malloc(self.room * sizeof(int64_t))
            self.keys = <uint64_t*> malloc(self.room * sizeof(uint64_t))
            self.stored = <uint64_t*> malloc(self.room * sizeof(uint64_t))
            self.nodes = <int64_t*> malloc(self.room * sizeof(int64_t))
            self.slots = <int64_t*> malloc(self.room * sizeof(int64_t))
            if self.nodes == NULL or self.slots == NULL or self.cached == NULL or self.marks == NULL or self.positions == NULL or self.keys == NULL or self.stored == NULL:
                raise MemoryError()
        return 0

    def serve(self, const uint64_t[:] hashes, const int64_t[:] offsets, const int64_t[:] prompt,
              const int64_t[:] block_tokens, int64_t[:] hist, int64_t[:] tier_hits,
              int64_t[:] totals):
        """Requests ``r`` = ``hashes[offsets[r]:offsets[r + 1]]`` in order: tokens added to
        ``hist`` (one entry per bin), tokens each simulated vLLM tier pair serves past the GPU
        to ``tier_hits``, and ``totals`` += [requests, prompt tokens, tokens the GPU alone serves,
        block references]."""
        cdef Py_ssize_t r, n = prompt.shape[0]
        cdef const uint64_t* h
        if hist.shape[0] != self.n_edges + 1 or totals.shape[0] < 4:
            raise ValueError(f"hist needs {self.n_edges + 1} entries and totals 4")
        if offsets.shape[0] != n + 1 or block_tokens.shape[0] != n:
            raise ValueError("offsets need one entry per request plus one; block_tokens one each")
        if tier_hits.shape[0] < len(self.tiers):
            raise ValueError(f"tier_hits needs {len(self.tiers)} entries")
        for r in range(n):
            h = &hashes[offsets[r]] if offsets[r + 1] > offsets[r] else NULL
            if self.semantics == SEM_EXCLUSIVE:
                totals[2] += self._exclusive(h, offsets[r + 1] - offsets[r], prompt[r],
                                             block_tokens[r], hist)
            else:
                totals[2] += self._vllm(h, offsets[r + 1] - offsets[r], prompt[r],
                                        block_tokens[r], hist, tier_hits)
            totals[0] += 1
            totals[1] += prompt[r]
            totals[3] += offsets[r + 1] - offsets[r]

    cdef int64_t _exclusive(self, const uint64_t* h, Py_ssize_t nb, int64_t prompt, int64_t bt,
                            int64_t[:] hist) except -1:
        """The tiers' stack, and the GPU's own (the GPU alone: its chain is shorter, so it
        pins other blocks first); returns the tokens the GPU alone serves."""
        cdef Py_ssize_t i, b = 0
        cdef int64_t d, most = 0, gpu_tokens = 0
        self._scratch(nb + 1)
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

    cdef int _pinned_first(self, RecencyStack stack, const uint64_t* h, Py_ssize_t nb,
                           const int8_t* pinned) except -1:
        cdef Py_ssize_t i
        for i in range(nb):
            if pinned[i]:
                stack.access(h[i])
        for i in range(nb):
            if not pinned[i]:
                stack.access(h[i])
        return 0

    cdef int64_t _vllm(self, const uint64_t* h, Py_ssize_t nb, int64_t prompt, int64_t bt,
                       int64_t[:] hist, int64_t[:] tier_hits) except -1:
        cdef Py_ssize_t i, g = 0, b = 0, k, first = 0
        cdef Py_ssize_t cacheable = max(0, min(nb, prompt // bt))
        cdef Py_ssize_t gpu_limit = max(0, min(nb, (prompt - 1) // bt))
        cdef int64_t d, most = 0, gpu_tokens = 0
        cdef VllmCpuTier tier
        self._scratch(cacheable + 1)
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
                                       self.keys, self.stored, self.nodes, self.slots)
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
