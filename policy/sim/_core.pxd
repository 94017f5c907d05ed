# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
# The replay core's shared declarations: the one tier protocol (``Tier``), the flow base and
# its observers (``Flow``, ``Observer``, ``OfferObserver``), the admitter base and the score
# table, dense ids (``Interner``) and the buffers every per-block structure is made of. Declared
# here once so another extension can ``cimport`` them (the learned kernels,
# ``kvtier.policy.learn._kernels``, subclass ``Tier`` and ``Observer``); a call through these
# declarations is the same vtable call as one inside the core. Inline bodies live here so
# both modules inline them.

from libc.stdint cimport int8_t, int32_t, int64_t, uint64_t
from libc.stdlib cimport free, realloc

ctypedef int32_t id_t

cdef enum:
    NONE = -1         # no block / no list / no parent
    MAX_LISTS = 101   # TensorRT-LLM priorities 0..100 are the most lists one structure holds


# ---- growable C arrays (``_buffers.pxi``): memory grows with distinct blocks only

cdef inline id_t* grow_ids(id_t* p, Py_ssize_t old, Py_ssize_t new, id_t fill) except NULL:
    cdef id_t* q = <id_t*> realloc(p, new * sizeof(id_t))
    cdef Py_ssize_t i
    if q == NULL:
        raise MemoryError()
    for i in range(old, new):
        q[i] = fill
    return q


cdef inline int64_t* grow_i64(int64_t* p, Py_ssize_t old, Py_ssize_t new, int64_t fill) except NULL:
    cdef int64_t* q = <int64_t*> realloc(p, new * sizeof(int64_t))
    cdef Py_ssize_t i
    if q == NULL:
        raise MemoryError()
    for i in range(old, new):
        q[i] = fill
    return q


cdef inline double* grow_f64(double* p, Py_ssize_t old, Py_ssize_t new, double fill) except NULL:
    cdef double* q = <double*> realloc(p, new * sizeof(double))
    cdef Py_ssize_t i
    if q == NULL:
        raise MemoryError()
    for i in range(old, new):
        q[i] = fill
    return q


cdef inline int8_t* grow_i8(int8_t* p, Py_ssize_t old, Py_ssize_t new, int8_t fill) except NULL:
    cdef int8_t* q = <int8_t*> realloc(p, new)
    cdef Py_ssize_t i
    if q == NULL:
        raise MemoryError()
    for i in range(old, new):
        q[i] = fill
    return q


cdef inline Py_ssize_t grown(Py_ssize_t have, Py_ssize_t need):
    return max(need, 2 * have, 1024)


cdef struct Buf:
    id_t* data
    Py_ssize_t n, cap


cdef inline int buf_push(Buf* b, id_t v) except -1:
    if b.n == b.cap:
        b.cap = max(16, 2 * b.cap)
        b.data = <id_t*> realloc(b.data, b.cap * sizeof(id_t))
        if b.data == NULL:
            raise MemoryError()
    b.data[b.n] = v
    b.n += 1
    return 0


cdef inline void buf_free(Buf* b):
    free(b.data)
    b.data = NULL
    b.n = b.cap = 0


cdef class Lists:
    """Up to MAX_LISTS doubly linked lists over dense ids; an id is in at most one list.
    Head = oldest (evicted first), tail = newest."""

    cdef id_t* prev
    cdef id_t* nxt
    cdef int8_t* tag           # the list an id is in, -1: none
    cdef id_t heads[MAX_LISTS]
    cdef id_t tails[MAX_LISTS]
    cdef Py_ssize_t lens[MAX_LISTS]
    cdef Py_ssize_t n_ids

    cdef int reserve(self, Py_ssize_t n) except -1

    cdef inline void unlink(self, id_t k):
        cdef int t = self.tag[k]
        cdef id_t p = self.prev[k]
        cdef id_t q = self.nxt[k]
        if p == NONE:
            self.heads[t] = q
        else:
            self.nxt[p] = q
        if q == NONE:
            self.tails[t] = p
        else:
            self.prev[q] = p
        self.lens[t] -= 1
        self.tag[k] = -1

    cdef inline void append(self, int t, id_t k):
        self.prev[k] = self.tails[t]
        self.nxt[k] = NONE
        if self.tails[t] == NONE:
            self.heads[t] = k
        else:
            self.nxt[self.tails[t]] = k
        self.tails[t] = k
        self.lens[t] += 1
        self.tag[k] = t

    cdef inline void to_tail(self, int t, id_t k):
        if self.tails[t] != k or self.tag[k] != t:
            if self.tag[k] >= 0:
                self.unlink(k)
            self.append(t, k)

    cdef inline id_t pop_head(self, int t):
        cdef id_t k = self.heads[t]
        self.unlink(k)
        return k


# ---- dense ids (``_ids.pxi``)

cdef class Interner:
    """uint64 block hashes <-> dense ids 0..n-1 (first seen, first numbered)."""

    cdef uint64_t* keys
    cdef id_t* slots
    cdef Py_ssize_t mask
    cdef uint64_t* by_id
    cdef Py_ssize_t by_id_cap
    cdef readonly Py_ssize_t n

    cdef inline Py_ssize_t _slot(self, uint64_t key):
        # Fibonacci hashing: 0x9E3779B97F4A7C15 is 2**64 over the golden ratio
        return <Py_ssize_t> ((key * <uint64_t> 0x9E3779B97F4A7C15) >> 24) & self.mask

    cdef int _rehash(self) except -1
    cdef id_t intern(self, uint64_t key) except -2
    cdef id_t find(self, uint64_t key)


# ---- the one tier protocol (``_tier.pxi`` documents it)

cdef struct Info:
    int64_t priority
    int64_t next_use
    int64_t position


cdef class Tier:
    cdef readonly int64_t capacity      # -1: unlimited
    cdef readonly Py_ssize_t size
    cdef int8_t* inside
    cdef Py_ssize_t n_ids
    cdef readonly bint reads_info        # its order reads priority / next use
    cdef readonly bint uses_future       # it needs each block's next use (Belady)
    cdef readonly bint request_scoped    # begin/finish matter

    cdef int set_capacity(self, capacity) except -1
    cdef int reserve(self, Py_ssize_t n) except -1
    cdef int _reserve(self, Py_ssize_t old, Py_ssize_t new) except -1

    cdef inline bint has(self, id_t k):
        return self.inside[k]

    # per-access hooks
    cdef void c_before_insert(self, id_t k, Info* info)
    cdef void c_store(self, id_t k, Info* info)
    cdef void c_hit(self, id_t k, Info* info)
    cdef id_t c_evict(self)
    cdef void c_forget(self, id_t k)

    # the protocol
    cdef int begin(self) except -1
    cdef int finish(self) except -1
    cdef int on_miss(self, Buf* keys) except -1
    cdef int touch(self, id_t k, Info* info) except -1
    cdef int insert(self, id_t k, Info* info, Buf* victims) except -1
    cdef int remove(self, id_t k) except -1
    cdef int evict(self, Py_ssize_t n, int8_t* protected, Buf* out) except -1


# ---- flows and what watches them (``_flow.pxi``)

cdef struct Totals:
    int64_t requests, prompt_tokens, gpu_hit_tokens, cpu_promotion_tokens
    int64_t cold_promotion_tokens, recompute_tokens, block_refs, gpu_hit_blocks
    int64_t cpu_promotion_blocks, cold_promotion_blocks, recompute_blocks, cpu_stores_total
    int64_t cold_stores_total, gpu_evictions_total, cpu_evictions_total, cold_evictions_total
    int64_t drops_total


cdef class Flow


cdef class Observer:
    """Sees each request before it is served (feature trackers, learned orders)."""

    cdef int before(self, Flow flow, const id_t* hs, Py_ssize_t nb, int64_t prompt,
                    int64_t bt) except -1
    cdef int reserve(self, Py_ssize_t n) except -1


cdef class OfferObserver(Observer):
    """What an exclusive flow reports of its CPU tier: each block offered to it, a block that
    left it unpromoted (``forget``), a block promoted out of it (``promoted``, ``hit``: as part
    of the request's prefix). The learned offer log is one."""

    cdef int offer(self, Flow flow, id_t k) except -1
    cdef void forget(self, id_t k)
    cdef void promoted(self, id_t k, bint hit)


cdef class Flow:
    """Base of the compiled flows: one request at a time, state carried between them."""
    cdef Totals t
    cdef readonly Interner interner
    cdef int8_t* found
    cdef Py_ssize_t found_cap
    cdef readonly int64_t request_index     # of the request being served
    cdef Py_ssize_t n_ids
    # movement events: kind, block id, tier from, tier to
    cdef bint logging
    cdef int8_t* ev_kind
    cdef id_t* ev_key
    cdef int8_t* ev_from
    cdef int8_t* ev_to
    cdef Py_ssize_t ev_n, ev_cap
    # parents (chained admission), noted before each request is served
    cdef bint track_parents
    cdef id_t* parents
    # per-request inputs some observers read (set_requests), and the observers
    cdef const double[:] arrival_s
    cdef const int64_t[:] turns
    cdef const int8_t[:] subagents
    cdef const int64_t[:] sessions
    cdef const int8_t[:] finish_classes      # how each request ended (FINISH_CLASSES index)
    cdef const double[:] finish_s            # when it ended (arrival + end-to-end latency)
    cdef int64_t requests_from               # request index of row 0 of those arrays
    cdef readonly list observers

    # subclasses
    cdef int _reserve(self, Py_ssize_t old, Py_ssize_t new) except -1
    cdef Py_ssize_t lookup(self, const id_t* hs, Py_ssize_t nb, int64_t prompt, int64_t bt) except -1
    cdef int serve(self, const id_t* hs, Py_ssize_t nb, Py_ssize_t nf, int64_t prompt,
                   int64_t bt, const int64_t* next_uses) except -1
    cdef bint held_above_cold(self, id_t k)
    cdef bint in_tier(self, int tier, id_t k)

    # shared
    cdef int reserve(self, Py_ssize_t n) except -1
    cdef int account(self, Py_ssize_t nb, Py_ssize_t nf, int64_t prompt, int64_t bt,
                     int64_t* row) except -1

    cdef inline id_t parent_of(self, id_t k):
        return self.parents[k] if self.track_parents else NONE

    cdef inline int log(self, int kind, id_t k, int tier_from, int tier_to) except -1:
        cdef Py_ssize_t new
        if not self.logging:
            return 0
        if self.ev_n == self.ev_cap:
            new = grown(self.ev_cap, self.ev_n + 1)
            self.ev_kind = grow_i8(self.ev_kind, self.ev_cap, new, 0)
            self.ev_key = grow_ids(self.ev_key, self.ev_cap, new, 0)
            self.ev_from = grow_i8(self.ev_from, self.ev_cap, new, 0)
            self.ev_to = grow_i8(self.ev_to, self.ev_cap, new, 0)
            self.ev_cap = new
        self.ev_kind[self.ev_n] = kind
        self.ev_key[self.ev_n] = k
        self.ev_from[self.ev_n] = tier_from
        self.ev_to[self.ev_n] = tier_to
        self.ev_n += 1
        return 0

    cdef inline int one(self, const id_t* hs, Py_ssize_t nb, int64_t prompt, int64_t bt,
                        const int64_t* next_uses, int64_t* row) except -1:
        cdef Py_ssize_t nf, i
        if nb > self.found_cap:
            self.found_cap = 2 * nb
            self.found = <int8_t*> realloc(self.found, self.found_cap)
            if self.found == NULL:
                raise MemoryError()
        self.request_index += 1
        for observer in self.observers:
            (<Observer> observer).before(self, hs, nb, prompt, bt)
        if self.track_parents:
            for i in range(1, nb):
                self.parents[hs[i]] = hs[i - 1]
        nf = self.lookup(hs, nb, prompt, bt)
        self.account(nb, nf, prompt, bt, row)
        self.serve(hs, nb, nf, prompt, bt, next_uses)
        return nf

    cdef inline Py_ssize_t row(self):
        """The row of the request being served in the set_requests arrays (-1: none)."""
        cdef int64_t r = self.request_index - self.requests_from
        return r if self.arrival_s is not None and 0 <= r < self.arrival_s.shape[0] else -1

    cdef inline double now_s(self):
        cdef Py_ssize_t r = self.row()
        return self.arrival_s[r] if r >= 0 else 0.0


# ---- admission (``_admit.pxi``)

cdef class Admitter:
    cdef readonly bint reads_info
    # what the admitter must see of every request before it is served (``None``: nothing);
    # a flow adds it to its observers (the sighting filter counts requests through it)
    cdef readonly Observer observer

    cdef int reserve(self, Py_ssize_t n) except -1
    cdef int admit(self, Flow flow, id_t k, Info* info) except -1


cdef class ScoreTable(Admitter):
    """A learned model's score per offer, keyed by (request index, block hash); learned
    retention reads the same table as its scores."""
    cdef const int32_t[:] requests      # sorted by (request, hash)
    cdef const uint64_t[:] hashes
    cdef const double[:] scores
    cdef readonly double threshold
    cdef readonly bint chained
    cdef readonly int64_t misses
    cdef int64_t at_request
    cdef Py_ssize_t lo, hi

    cdef void _seek(self, int64_t request)
    cdef bint lookup(self, int64_t request, uint64_t h, double* score)
