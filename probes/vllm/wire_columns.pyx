# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
# distutils: language = c++
"""vLLM KV-event payloads straight into block-event columns: no Python object per event.

:class:`FrameColumns` walks one msgpack payload (``[ts, events, dp_rank?]``; events as maps
keyed by ``"type"`` or as legacy tagged arrays; see :mod:`kvtier.probes.vllm.wire` for the format and
the mapping to rows) and appends one row per block hash to C++ vectors. It accepts only what it
is sure of; on anything else (a bad or unusual event, a non-ASCII medium, an ext type, a
``block_size`` the schema cannot hold) it appends nothing and answers :data:`FALLBACK`, and the
caller decodes that frame with :func:`kvtier.probes.vllm.wire.decode_payload`, which is also the oracle
the tests compare this module against.

:class:`StreamColumns` holds a stream's rows until the tap flushes them, applying GPU residency
on the way in (an ``AllBlocksCleared`` becomes one evict per resident GPU block, in hash order,
as :mod:`kvtier.probes.vllm.streams` describes), with the resident hashes in a :class:`ResidentSet`.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from libc.string cimport memcmp, memcpy

import numpy as np

include "msgpack_reader.pxi"
include "resident_set.pxi"

#: add_payload's answers
DECODED = 0
FALLBACK = 1

# Outcome / Tier codes of kvtier.collector.events (tests pin them to the enums)
cdef enum:
    STORE = 4
    EVICT = 5
    GPU = 0
    CPU = 1
    COLD = 2
    NO_TIER = -1
    NO_TOKENS = -1

cdef enum Kind:
    UNKNOWN = 0
    STORED = 1
    REMOVED = 2
    CLEARED = 3


cdef inline int kind_of(const uint8_t* s, Py_ssize_t n) noexcept nogil:
    if n == 11 and memcmp(s, b"BlockStored", 11) == 0:
        return STORED
    if n == 12 and memcmp(s, b"BlockRemoved", 12) == 0:
        return REMOVED
    if n == 16 and memcmp(s, b"AllBlocksCleared", 16) == 0:
        return CLEARED
    return UNKNOWN


cdef inline bint same_upper(const uint8_t* s, const char* word, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i
    cdef uint8_t c
    for i in range(n):
        c = s[i]
        if 0x61 <= c <= 0x7a:
            c -= 0x20
        if c != <uint8_t>word[i]:
            return False
    return True


cdef inline int read_medium(Reader* r) noexcept nogil:
    """``medium`` -> tier code, as ``wire.medium_to_tier`` (ASCII names only), or -1."""
    cdef Py_ssize_t start, n
    cdef bint ascii
    if r.pos < r.end and r.p[r.pos] == 0xc0:
        r.pos += 1
        return GPU
    if read_str(r, &start, &n, &ascii) or not ascii:
        return -1
    if n >= 3 and same_upper(r.p + start, b"GPU", 3):
        return GPU
    if n >= 3 and same_upper(r.p + start, b"CPU", 3):
        return CPU
    if (n == 7 and same_upper(r.p + start, b"STORAGE", 7)) or (n == 4 and same_upper(r.p + start, b"DISK", 4)):
        return COLD
    return -1


cdef inline int read_hash(Reader* r, uint64_t* v) noexcept nogil:
    """A block hash as ``wire.to_block_hash`` folds it: an int mod 2**64, or the last 8 bytes
    of a non-empty bin, big-endian."""
    cdef Py_ssize_t start, n
    cdef bint negative
    if r.pos < r.end and 0xc4 <= r.p[r.pos] <= 0xc6:
        if read_bin(r, &start, &n) or n == 0:
            return -1
        v[0] = big_endian(r.p + start + (n - 8 if n > 8 else 0), 8 if n > 8 else <int>n)
        return 0
    return read_int(r, v, &negative)


cdef class FrameColumns:
    """Rows of block events as C++ vectors, and where ``AllBlocksCleared`` happened."""

    cdef vector[double] time_s
    cdef vector[int8_t] kind
    cdef vector[uint64_t] block_hash
    cdef vector[uint64_t] parent_hash
    cdef vector[uint8_t] parent_null
    cdef vector[int32_t] tokens
    cdef vector[int8_t] tier_from
    cdef vector[int8_t] tier_to
    cdef vector[size_t] clears
    cdef readonly double ts_s
    cdef readonly int64_t dp_rank  # -1: absent or nil

    def __len__(self):
        return self.time_s.size()

    cdef void truncate(self, size_t rows, size_t clears) noexcept nogil:
        self.time_s.resize(rows)
        self.kind.resize(rows)
        self.block_hash.resize(rows)
        self.parent_hash.resize(rows)
        self.parent_null.resize(rows)
        self.tokens.resize(rows)
        self.tier_from.resize(rows)
        self.tier_to.resize(rows)
        self.clears.resize(clears)

    def clear(self):
        self.truncate(0, 0)

    cdef inline void push(self, double ts, int8_t kind, uint64_t block_hash, uint64_t parent,
                          uint8_t parent_null, int32_t tokens, int8_t tier_from,
                          int8_t tier_to) noexcept nogil:
        self.time_s.push_back(ts)
        self.kind.push_back(kind)
        self.block_hash.push_back(block_hash)
        self.parent_hash.push_back(parent)
        self.parent_null.push_back(parent_null)
        self.tokens.push_back(tokens)
        self.tier_from.push_back(tier_from)
        self.tier_to.push_back(tier_to)

    cdef int event(self, Reader* r, double ts) noexcept nogil:
        """Append one event's rows; -1 leaves the frame to the general decoder."""
        cdef Py_ssize_t n, i, start, length
        cdef Py_ssize_t at_hashes = -1, at_parent = -1, at_size = -1, at_medium = -1
        cdef int kind = UNKNOWN, tier = GPU
        cdef int8_t tier_from = NO_TIER, tier_to = NO_TIER
        cdef int32_t tokens = NO_TOKENS
        cdef uint64_t h, parent = 0, size
        cdef uint8_t parent_null = 1, b
        cdef bint ascii, negative
        cdef Reader q
        if short_of(r, 1):
            return -1
        b = r.p[r.pos]
        if 0x80 <= b <= 0x8f or b == 0xde or b == 0xdf:  # {"type": ..., field: value, ...}
            n = read_map(r)
            if n < 0:
                return -1
            for i in range(n):
                if read_str(r, &start, &length, &ascii):
                    return -1
                if length == 4 and memcmp(r.p + start, b"type", 4) == 0:
                    if read_str(r, &start, &length, &ascii):
                        return -1
                    kind = kind_of(r.p + start, length)
                    continue
                if length == 12 and memcmp(r.p + start, b"block_hashes", 12) == 0:
                    at_hashes = r.pos
                elif length == 17 and memcmp(r.p + start, b"parent_block_hash", 17) == 0:
                    at_parent = r.pos
                elif length == 10 and memcmp(r.p + start, b"block_size", 10) == 0:
                    at_size = r.pos
                elif length == 6 and memcmp(r.p + start, b"medium", 6) == 0:
                    at_medium = r.pos
                if skip(r, 0):
                    return -1
        elif 0x90 <= b <= 0x9f or b == 0xdc or b == 0xdd:  # ["BlockStored", hashes, ...]
            n = read_array(r)
            if n < 1 or read_str(r, &start, &length, &ascii):
                return -1
            kind = kind_of(r.p + start, length)
            for i in range(1, n):  # positions of wire.LEGACY_FIELDS
                if kind == STORED:
                    if i == 1:
                        at_hashes = r.pos
                    elif i == 2:
                        at_parent = r.pos
                    elif i == 4:
                        at_size = r.pos
                    elif i == 6:
                        at_medium = r.pos
                elif kind == REMOVED:
                    if i == 1:
                        at_hashes = r.pos
                    elif i == 2:
                        at_medium = r.pos
                if skip(r, 0):
                    return -1
        else:
            return -1
        if kind == UNKNOWN:
            return -1
        if kind == CLEARED:
            self.clears.push_back(self.time_s.size())
            return 0
        if at_hashes < 0:
            return -1
        q.p, q.end = r.p, r.end
        if at_medium >= 0:
            q.pos = at_medium
            tier = read_medium(&q)
            if tier < 0:
                return -1
        if kind == STORED:
            if at_size >= 0:
                q.pos = at_size
                if q.p[q.pos] == 0xc2 or q.p[q.pos] == 0xc3:
                    return -1  # a bool block_size: the schema rejects the row
                if read_int(&q, &size, &negative) == 0 and not negative and size > 0:
                    if size >= 2147483648ULL:
                        return -1
                    tokens = <int32_t>size
            if at_parent >= 0:
                q.pos = at_parent
                if q.p[q.pos] != 0xc0:
                    if read_hash(&q, &parent):
                        return -1
                    parent_null = 0
            if tier == GPU:
                tier_to = GPU
            elif tier == CPU:
                tier_from, tier_to = GPU, CPU
            else:
                tier_from, tier_to = CPU, COLD
        else:
            tier_from = <int8_t>tier
        q.pos = at_hashes
        n = read_array(&q)
        if n < 0:
            return -1
        for i in range(n):
            if read_hash(&q, &h):
                return -1
            if kind == REMOVED:
                self.push(ts, EVICT, h, 0, 1, NO_TOKENS, tier_from, NO_TIER)
            else:
                self.push(ts, STORE, h, parent, parent_null, tokens, tier_from, tier_to)
                parent = h  # one BlockStored's hashes are a chain
                parent_null = 0
        return 0

    cpdef int add_payload(self, bytes payload):
        """Decode one msgpack payload and append its rows: :data:`DECODED`, or
        :data:`FALLBACK` with nothing appended."""
        cdef Reader r
        cdef size_t rows = self.time_s.size(), clears = self.clears.size()
        cdef Py_ssize_t n, m, i
        cdef uint64_t v
        cdef uint32_t v32
        cdef float f32
        cdef double ts
        cdef bint negative
        cdef uint8_t b
        r.p = <const uint8_t*>PyBytes_AS_STRING(payload)
        r.pos, r.end = 0, PyBytes_GET_SIZE(payload)
        n = read_array(&r)
        if (n != 2 and n != 3) or short_of(&r, 1):
            return FALLBACK
        b = r.p[r.pos]
        if b == 0xcb and not short_of(&r, 9):
            v = big_endian(r.p + r.pos + 1, 8)
            memcpy(&ts, &v, 8)
            r.pos += 9
        elif b == 0xca and not short_of(&r, 5):
            v32 = <uint32_t>big_endian(r.p + r.pos + 1, 4)
            memcpy(&f32, &v32, 4)
            ts = <double>f32
            r.pos += 5
        elif read_int(&r, &v, &negative) == 0:
            ts = <double>(<int64_t>v) if negative else <double>v
        else:
            return FALLBACK
        if not ts >= 0:  # negative or NaN
            return FALLBACK
        m = read_array(&r)
        if m < 0:
            return FALLBACK
        for i in range(m):
            if self.event(&r, ts):
                self.truncate(rows, clears)
                return FALLBACK
        self.dp_rank = -1
        if n == 3:
            if r.pos < r.end and r.p[r.pos] == 0xc0:
                r.pos += 1
            elif read_int(&r, &v, &negative) or negative or v >= (1ULL << 63):
                self.truncate(rows, clears)
                return FALLBACK
            else:
                self.dp_rank = <int64_t>v
        if r.pos != r.end:  # trailing bytes: not one msgpack value
            self.truncate(rows, clears)
            return FALLBACK
        self.ts_s = ts
        return DECODED

    def add_rows(self, double ts_s, double[::1] time_s, int8_t[::1] kind,
                 uint64_t[::1] block_hash, uint64_t[::1] parent_hash, uint8_t[::1] parent_null,
                 int32_t[::1] tokens, int8_t[::1] tier_from, int8_t[::1] tier_to, clears=()):
        """Append one frame's rows decoded elsewhere (the general decoder's, for a frame this
        module left to it): ``ts_s`` is the frame's time, ``clears`` the row indices (in these
        rows) where ``AllBlocksCleared`` happened."""
        cdef size_t base = self.time_s.size()
        self.ts_s = ts_s
        cdef Py_ssize_t i
        for i in range(time_s.shape[0]):
            self.push(time_s[i], kind[i], block_hash[i], parent_hash[i], parent_null[i],
                      tokens[i], tier_from[i], tier_to[i])
        for i in clears:
            self.clears.push_back(base + <size_t>i)

    def take(self):
        """The rows as numpy arrays (a dict by column; ``parent_null`` as bool), then empty."""
        cdef size_t n = self.time_s.size()
        out = {"time_s": np.empty(n, np.float64), "kind": np.empty(n, np.int8),
               "block_hash": np.empty(n, np.uint64), "parent_hash": np.empty(n, np.uint64),
               "parent_null": np.empty(n, np.uint8), "tokens": np.empty(n, np.int32),
               "tier_from": np.empty(n, np.int8), "tier_to": np.empty(n, np.int8)}
        if n:
            _copy(out["time_s"], self.time_s.data(), n * 8)
            _copy(out["kind"], self.kind.data(), n)
            _copy(out["block_hash"], self.block_hash.data(), n * 8)
            _copy(out["parent_hash"], self.parent_hash.data(), n * 8)
            _copy(out["parent_null"], self.parent_null.data(), n)
            _copy(out["tokens"], self.tokens.data(), n * 4)
            _copy(out["tier_from"], self.tier_from.data(), n)
            _copy(out["tier_to"], self.tier_to.data(), n)
        out["parent_null"] = out["parent_null"].view(np.bool_)
        out["clears"] = np.array([self.clears[i] for i in range(self.clears.size())], np.int64)
        self.truncate(0, 0)
        return out


cdef void _copy(object array, const void* source, size_t nbytes):
    cdef uint8_t[::1] target = array.view(np.uint8)
    memcpy(&target[0], source, nbytes)


cdef class StreamColumns(FrameColumns):
    """One stream's rows since its last flush, residency applied as they come in."""

    cdef ResidentSet resident
    cdef vector[uint64_t] scratch

    def __cinit__(self):
        self.resident = ResidentSet()

    @property
    def resident_blocks(self):
        return self.resident.size()

    def is_resident(self, uint64_t block_hash):
        return block_hash in self.resident

    def forget_residency(self):
        """A restarted engine starts with an empty GPU cache."""
        self.resident.reset()

    cpdef void absorb(self, FrameColumns frame, size_t max_tracked):
        """Move ``frame``'s rows here (``frame`` is left empty): each ``AllBlocksCleared``
        becomes an evict per resident GPU block at the frame's time, GPU stores enter the
        resident set (while it holds fewer than ``max_tracked``), GPU evicts leave it."""
        cdef size_t n = frame.time_s.size(), i, c = 0, k, nc = frame.clears.size()
        cdef int8_t kind, tier_from, tier_to
        cdef uint64_t h
        with nogil:
            for i in range(n + 1):
                while c < nc and frame.clears[c] == i:
                    self.resident.sorted_into(&self.scratch)
                    for k in range(self.scratch.size()):
                        self.push(frame.ts_s, EVICT, self.scratch[k], 0, 1, NO_TOKENS, GPU, NO_TIER)
                    self.resident.reset()
                    c += 1
                if i == n:
                    break
                if i + 8 < n:
                    self.resident.prefetch(frame.block_hash[i + 8])
                kind, tier_from, tier_to = frame.kind[i], frame.tier_from[i], frame.tier_to[i]
                h = frame.block_hash[i]
                self.push(frame.time_s[i], kind, h, frame.parent_hash[i], frame.parent_null[i],
                          frame.tokens[i], tier_from, tier_to)
                if kind == STORE and tier_to == GPU:
                    if self.resident.size() < max_tracked:
                        self.resident.add(h)
                elif kind == EVICT and tier_from == GPU:
                    self.resident.discard(h)
        frame.truncate(0, 0)
