# What every flow shares: totals, per-request outputs, lookup accounting, the movement event
# log, block parents for chained admission, and the replay loops.

TOTALS = ("requests", "prompt_tokens", "gpu_hit_tokens", "cpu_promotion_tokens",
          "cold_promotion_tokens", "recompute_tokens", "block_refs", "gpu_hit_blocks",
          "cpu_promotion_blocks", "cold_promotion_blocks", "recompute_blocks",
          "cpu_stores_total", "cold_stores_total", "gpu_evictions_total",
          "cpu_evictions_total", "cold_evictions_total", "drops_total")
OUTCOME_COLUMNS = ("gpu_hit_tokens", "cpu_promotion_tokens", "cold_promotion_tokens",
                   "recompute_tokens")
# movement event kinds (kvtier.collector.events.Outcome values) and tiers (Tier values, -1: none)
EV_STORE = 4
EV_EVICT = 5
EV_DROP = 6
DEF K_STORE = 4
DEF K_EVICT = 5
DEF K_DROP = 6
DEF GPU = 0
DEF CPU = 1
DEF COLD = 2
DEF OFF = -1


cdef class Observer:
    """Sees each request before it is served (feature trackers, learned orders)."""

    cdef int before(self, Flow flow, const id_t* hs, Py_ssize_t nb, int64_t prompt,
                    int64_t bt) except -1:
        return 0

    cdef int reserve(self, Py_ssize_t n) except -1:
        return 0


cdef class OfferObserver(Observer):
    """What an exclusive flow reports of its CPU tier: each block offered to it, a block that
    left it unpromoted (``forget``), a block promoted out of it (``promoted``, ``hit``: as part
    of the request's prefix). The learned offer log (``kvtier.policy.learn._kernels``) is one."""

    cdef int offer(self, Flow flow, id_t k) except -1:
        return 0

    cdef void forget(self, id_t k):
        pass

    cdef void promoted(self, id_t k, bint hit):
        pass


cdef class Flow:
    """Base of the compiled flows: one request at a time, state carried between them."""

    def __cinit__(self, *args, **kwargs):
        memset(&self.t, 0, sizeof(Totals))
        self.interner = Interner()
        self.found_cap = 1024
        self.found = <int8_t*> malloc(self.found_cap)
        self.request_index = -1
        self.n_ids = 0
        self.logging = False
        self.ev_kind = self.ev_from = self.ev_to = NULL
        self.ev_key = NULL
        self.ev_n = self.ev_cap = 0
        self.track_parents = False
        self.parents = NULL
        self.observers = []
        self.requests_from = 0

    def __dealloc__(self):
        free(self.found)
        free(self.ev_kind)
        free(self.ev_key)
        free(self.ev_from)
        free(self.ev_to)
        free(self.parents)

    # ---- subclasses
    cdef int _reserve(self, Py_ssize_t old, Py_ssize_t new) except -1:
        return 0

    cdef Py_ssize_t lookup(self, const id_t* hs, Py_ssize_t nb, int64_t prompt, int64_t bt) except -1:
        """Fill ``found[:n]`` with the tier serving each leading block; returns n."""
        return 0

    cdef int serve(self, const id_t* hs, Py_ssize_t nb, Py_ssize_t nf, int64_t prompt,
                   int64_t bt, const int64_t* next_uses) except -1:
        return 0

    cdef bint held_above_cold(self, id_t k):
        return False

    cdef bint in_tier(self, int tier, id_t k):
        return False

    # ---- shared
    cdef int reserve(self, Py_ssize_t n) except -1:
        cdef Py_ssize_t new
        if n <= self.n_ids:
            return 0
        new = grown(self.n_ids, n)
        if self.track_parents:
            self.parents = grow_ids(self.parents, self.n_ids, new, NONE)
        for observer in self.observers:
            (<Observer> observer).reserve(new)
        self._reserve(self.n_ids, new)
        self.n_ids = new
        return 0

    # parent_of, log, one, row and now_s are inline, in _core.pxd

    cdef int account(self, Py_ssize_t nb, Py_ssize_t nf, int64_t prompt, int64_t bt,
                     int64_t* row) except -1:
        cdef Py_ssize_t i
        cdef int64_t tok
        cdef int64_t tokens[3]
        cdef int64_t blocks[3]
        tokens[0] = tokens[1] = tokens[2] = 0
        blocks[0] = blocks[1] = blocks[2] = 0
        for i in range(nf):
            tok = prompt - i * bt
            tok = bt if tok > bt else (0 if tok < 0 else tok)
            tokens[self.found[i]] += tok
            blocks[self.found[i]] += 1
        self.t.requests += 1
        self.t.prompt_tokens += prompt
        self.t.gpu_hit_tokens += tokens[0]
        self.t.cpu_promotion_tokens += tokens[1]
        self.t.cold_promotion_tokens += tokens[2]
        self.t.recompute_tokens += prompt - tokens[0] - tokens[1] - tokens[2]
        self.t.block_refs += nb
        self.t.gpu_hit_blocks += blocks[0]
        self.t.cpu_promotion_blocks += blocks[1]
        self.t.cold_promotion_blocks += blocks[2]
        self.t.recompute_blocks += nb - nf
        if row != NULL:
            row[0] = tokens[0]
            row[1] = tokens[1]
            row[2] = tokens[2]
            row[3] = prompt - tokens[0] - tokens[1] - tokens[2]
        return 0

    # ---- Python
    def totals(self):
        """The running totals, as ``SimResult`` field -> value."""
        cdef Totals* t = &self.t
        return dict(zip(TOTALS, (t.requests, t.prompt_tokens, t.gpu_hit_tokens,
                                 t.cpu_promotion_tokens, t.cold_promotion_tokens,
                                 t.recompute_tokens, t.block_refs, t.gpu_hit_blocks,
                                 t.cpu_promotion_blocks, t.cold_promotion_blocks,
                                 t.recompute_blocks, t.cpu_stores_total, t.cold_stores_total,
                                 t.gpu_evictions_total, t.cpu_evictions_total,
                                 t.cold_evictions_total, t.drops_total)))

    def observe(self, Observer observer):
        """Add an observer (before the first request)."""
        self.observers.append(observer)
        observer.reserve(self.n_ids)

    def set_requests(self, const double[:] arrival_s, const int64_t[:] turns=None,
                     const int8_t[:] subagents=None, const int64_t[:] sessions=None,
                     const int8_t[:] finish_classes=None, const double[:] finish_s=None,
                     int64_t first=-1):
        """Per-request arrival times and metadata for observers; row 0 is the request with
        index ``first`` (default: the next one served)."""
        self.arrival_s = arrival_s
        self.turns = turns
        self.subagents = subagents
        self.sessions = sessions
        self.finish_classes = finish_classes
        self.finish_s = finish_s
        self.requests_from = self.request_index + 1 if first < 0 else first

    def log_events(self, bint on=True):
        self.logging = on

    def take_events(self):
        """Movement events since the last call: (kind, hash, tier_from, tier_to) arrays."""
        cdef Py_ssize_t i, n = self.ev_n
        kinds = np.empty(n, dtype=np.int8)
        hashes = np.empty(n, dtype=np.uint64)
        froms = np.empty(n, dtype=np.int8)
        tos = np.empty(n, dtype=np.int8)
        cdef int8_t[:] k = kinds, f = froms, t = tos
        cdef uint64_t[:] h = hashes
        for i in range(n):
            k[i] = self.ev_kind[i]
            h[i] = self.interner.by_id[self.ev_key[i]]
            f[i] = self.ev_from[i]
            t[i] = self.ev_to[i]
        self.ev_n = 0
        return kinds, hashes, froms, tos

    def ids(self, const uint64_t[:] hashes):
        """Dense ids for block hashes (numbering new ones) in this flow's id space."""
        out = self.interner.ids(hashes)
        self.reserve(self.interner.n)
        return out

    def replay(self, const id_t[:] ids, const int64_t[:] offsets, const int64_t[:] prompt,
               const int64_t[:] block_tokens, const int64_t[:] next_uses=None,
               int64_t[:, :] outcomes=None, int8_t[:] found=None, Py_ssize_t start=0,
               Py_ssize_t stop=-1):
        """Serve requests ``start`` to ``stop`` (ids from :meth:`ids`, ``offsets`` into them,
        ``next_uses`` aligned with ids). ``outcomes`` (requests x 5), when given, receives each
        request's GPU hit, CPU promotion, cold promotion and recompute tokens and its count of
        leading blocks a tier served; ``found`` (aligned with ids) the tier of each of those."""
        cdef Py_ssize_t r, i, nf, n = prompt.shape[0] if stop < 0 else stop
        cdef const int64_t* nu = NULL
        cdef int64_t* row = NULL
        self.reserve(self.interner.n)
        if outcomes is not None and (outcomes.shape[1] != 5 or outcomes.shape[0] < n):
            raise ValueError("outcomes must have a row of 5 columns per request")
        if found is not None and found.shape[0] < ids.shape[0]:
            raise ValueError("found must have one entry per block reference")
        for r in range(start, n):
            if next_uses is not None:
                nu = &next_uses[offsets[r]]
            if outcomes is not None:
                row = &outcomes[r, 0]
            nf = self.one(&ids[offsets[r]], offsets[r + 1] - offsets[r], prompt[r],
                          block_tokens[r], nu, row)
            if row != NULL:
                row[4] = nf
            if found is not None:
                for i in range(nf):
                    found[offsets[r] + i] = self.found[i]

    def serve_one(self, const id_t[:] ids, int64_t prompt, int64_t block_tokens,
                  const int64_t[:] next_uses=None):
        """Serve one request: (tier of each leading block served: int8 array, [GPU hit,
        CPU promotion, cold promotion, recompute tokens])."""
        cdef Py_ssize_t nf, i
        cdef int64_t row[5]
        self.reserve(self.interner.n)
        nf = self.one(&ids[0] if ids.shape[0] else NULL, ids.shape[0], prompt, block_tokens,
                      &next_uses[0] if next_uses is not None and next_uses.shape[0] else NULL,
                      row)
        out = np.empty(nf, dtype=np.int8)
        cdef int8_t[:] o = out
        for i in range(nf):
            o[i] = self.found[i]
        return out, (row[0], row[1], row[2], row[3])

    def peek(self, const id_t[:] ids, int64_t prompt, int64_t block_tokens):
        """The tier of each leading block a request would be served from now (no change)."""
        cdef Py_ssize_t nf, i
        self.reserve(self.interner.n)
        if ids.shape[0] > self.found_cap:
            self.found_cap = 2 * ids.shape[0]
            self.found = <int8_t*> realloc(self.found, self.found_cap)
        nf = self.lookup(&ids[0] if ids.shape[0] else NULL, ids.shape[0], prompt, block_tokens)
        out = np.empty(nf, dtype=np.int8)
        cdef int8_t[:] o = out
        for i in range(nf):
            o[i] = self.found[i]
        return out

    def uses_future(self) -> bool:
        return False

    def contains(self, int tier, key) -> bool:
        """Whether ``tier`` (0 GPU, 1 CPU, 2 cold) holds block hash ``key``."""
        cdef id_t k = self.interner.id_of(key)
        return k != NONE and k < self.n_ids and self.in_tier(tier, k)

    def members(self, int tier):
        """The block hashes ``tier`` holds."""
        cdef Py_ssize_t i
        return [self.interner.by_id[i] for i in range(min(self.n_ids, self.interner.n))
                if self.in_tier(tier, <id_t> i)]
