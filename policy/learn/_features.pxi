# Per-block features at the moment a tier would admit a block, from the past only: the
# compiled form of kvtier.policy.learn.features.FeatureTracker (same values, bit for bit).

DEF N_FEATURES = 23
DEF RUNNING = 6      # the finish-class feature while the request runs: len(FINISH_CLASSES)


cdef class FeatureTracker:
    """Online per-block statistics over dense ids. ``observe`` each request in order; ``row``
    gives the features of a block offered now."""
    cdef double decay_per_s
    cdef Py_ssize_t n_ids
    cdef readonly int64_t requests
    cdef int8_t* known
    cdef double* first_s
    cdef double* last_s
    cdef int64_t* last_request
    cdef int64_t* position
    cdef double* depth_fraction
    cdef int64_t* tokens
    cdef int8_t* is_last
    cdef id_t* parent
    cdef int64_t* refs
    cdef int64_t* fanout
    cdef double* pop
    cdef double* pop_s
    cdef int64_t* turn
    cdef int8_t* subagent
    cdef int64_t* session_requests
    cdef int64_t* request_blocks
    cdef int64_t* request_seen
    cdef int64_t* request_prefix_refs
    cdef double* request_gap_s
    cdef int64_t* to_end
    cdef int64_t* chain_depth
    cdef int8_t* finish_class
    cdef double* finish_s
    cdef int64_t* session_counts
    cdef Py_ssize_t n_sessions

    def __cinit__(self, double half_life_s=300.0):
        if not half_life_s > 0:
            raise ValueError(f"half_life_s must be > 0, got {half_life_s!r}")
        self.decay_per_s = log(2.0) / half_life_s
        self.n_ids = 0
        self.requests = 0
        self.n_sessions = 0
        self.session_counts = NULL
        self.known = self.is_last = self.subagent = self.finish_class = NULL
        self.finish_s = NULL
        self.first_s = self.last_s = self.depth_fraction = self.pop = self.pop_s = NULL
        self.request_gap_s = NULL
        self.last_request = self.position = self.tokens = self.refs = self.fanout = NULL
        self.turn = self.session_requests = self.request_blocks = self.request_seen = NULL
        self.request_prefix_refs = self.to_end = self.chain_depth = NULL
        self.parent = NULL

    def __dealloc__(self):
        free(self.known); free(self.is_last); free(self.subagent); free(self.first_s)
        free(self.last_s); free(self.depth_fraction); free(self.pop); free(self.pop_s)
        free(self.request_gap_s); free(self.last_request); free(self.position)
        free(self.tokens); free(self.refs); free(self.fanout); free(self.turn)
        free(self.session_requests); free(self.request_blocks); free(self.request_seen)
        free(self.request_prefix_refs); free(self.to_end); free(self.chain_depth)
        free(self.parent); free(self.session_counts); free(self.finish_class)
        free(self.finish_s)

    cdef int reserve(self, Py_ssize_t n) except -1:
        cdef Py_ssize_t o = self.n_ids, new
        if n <= o:
            return 0
        new = grown(o, n)
        self.known = grow_i8(self.known, o, new, 0)
        self.is_last = grow_i8(self.is_last, o, new, 0)
        self.subagent = grow_i8(self.subagent, o, new, 0)
        self.first_s = grow_f64(self.first_s, o, new, 0)
        self.last_s = grow_f64(self.last_s, o, new, 0)
        self.depth_fraction = grow_f64(self.depth_fraction, o, new, 0)
        self.pop = grow_f64(self.pop, o, new, 0)
        self.pop_s = grow_f64(self.pop_s, o, new, 0)
        self.request_gap_s = grow_f64(self.request_gap_s, o, new, 0)
        self.last_request = grow_i64(self.last_request, o, new, 0)
        self.position = grow_i64(self.position, o, new, 0)
        self.tokens = grow_i64(self.tokens, o, new, 0)
        self.refs = grow_i64(self.refs, o, new, 0)
        self.fanout = grow_i64(self.fanout, o, new, 0)
        self.turn = grow_i64(self.turn, o, new, 0)
        self.session_requests = grow_i64(self.session_requests, o, new, 0)
        self.request_blocks = grow_i64(self.request_blocks, o, new, 0)
        self.request_seen = grow_i64(self.request_seen, o, new, 0)
        self.request_prefix_refs = grow_i64(self.request_prefix_refs, o, new, 0)
        self.to_end = grow_i64(self.to_end, o, new, 0)
        self.chain_depth = grow_i64(self.chain_depth, o, new, 0)
        self.finish_class = grow_i8(self.finish_class, o, new, 0)
        self.finish_s = grow_f64(self.finish_s, o, new, 0)
        self.parent = grow_ids(self.parent, o, new, NONE)
        self.n_ids = new
        return 0

    cdef inline double decayed(self, id_t k, double now_s):
        cdef double gap = now_s - self.pop_s[k]
        return self.pop[k] * exp(-self.decay_per_s * (gap if gap > 0.0 else 0.0))

    cdef int observe(self, const id_t* hs, Py_ssize_t n, double now, int64_t prompt,
                     int64_t bt, int64_t turn, bint subagent, int64_t session,
                     int8_t finish_class, double finish_s) except -1:
        """Fold one request in (``session`` -1: none; ``turn`` 0: unknown; how and when it
        ends: read only once it has)."""
        cdef int64_t session_count = 0, seen = 0, prefix_refs = 0, depth = 0, tok
        cdef double gap_s = 0.0
        cdef Py_ssize_t i, new
        cdef id_t h, par = NONE, deepest
        if session >= 0:
            if session >= self.n_sessions:
                new = grown(self.n_sessions, session + 1)
                self.session_counts = grow_i64(self.session_counts, self.n_sessions, new, 0)
                self.n_sessions = new
            self.session_counts[session] += 1
            session_count = self.session_counts[session]
        for i in range(n):
            h = hs[i]
            if not self.known[h]:
                break
            seen += 1
            prefix_refs = self.refs[h]
            gap_s = now - self.last_s[h]
        if seen:
            deepest = hs[seen - 1]
            depth = self.chain_depth[deepest] + 1 if self.to_end[deepest] <= 1 else 0
        for i in range(n):
            h = hs[i]
            tok = prompt - i * bt
            tok = bt if tok > bt else (0 if tok < 0 else tok)
            if not self.known[h]:
                self.known[h] = 1
                self.first_s[h] = now
                self.last_s[h] = now
                self.pop[h] = 0.0
                self.pop_s[h] = 0.0
                self.refs[h] = 0
                self.fanout[h] = 0
                self.parent[h] = par
                if par != NONE:
                    self.fanout[par] += 1
            self.refs[h] += 1
            self.pop[h] = self.decayed(h, now) + 1.0
            self.pop_s[h] = now
            self.last_s[h] = now
            self.last_request[h] = self.requests
            self.position[h] = i
            self.depth_fraction[h] = (<double> (i + 1)) / n
            self.tokens[h] = tok
            self.is_last[h] = i == n - 1
            self.turn[h] = turn
            self.subagent[h] = subagent
            self.session_requests[h] = session_count
            self.request_blocks[h] = n
            self.request_seen[h] = seen
            self.request_prefix_refs[h] = prefix_refs
            self.request_gap_s[h] = gap_s
            self.to_end[h] = n - 1 - i
            self.chain_depth[h] = depth
            self.finish_class[h] = finish_class
            self.finish_s[h] = finish_s
            par = h
        self.requests += 1
        return 0

    cdef void row(self, id_t k, double now, double* out):
        cdef id_t p = self.parent[k]
        out[0] = self.refs[k]
        out[1] = now - self.first_s[k]
        out[2] = now - self.last_s[k]
        out[3] = self.requests - self.last_request[k]
        out[4] = self.position[k]
        out[5] = self.depth_fraction[k]
        out[6] = self.fanout[k]
        out[7] = self.tokens[k]
        out[8] = self.is_last[k]
        out[9] = self.decayed(k, now)
        out[10] = self.decayed(p, now) if p != NONE else 0.0
        out[11] = self.refs[p] if p != NONE else 0.0
        out[12] = self.turn[k]
        out[13] = self.subagent[k]
        out[14] = self.session_requests[k]
        out[15] = self.request_blocks[k]
        out[16] = self.request_seen[k]
        out[17] = self.request_prefix_refs[k]
        out[18] = self.request_gap_s[k]
        out[19] = self.to_end[k]
        out[20] = self.chain_depth[k]
        out[21] = self.request_blocks[k] - self.request_seen[k]
        out[22] = self.finish_class[k] if self.finish_s[k] <= now else RUNNING

    def py_reserve(self, Py_ssize_t n):
        self.reserve(n)

    def py_observe(self, const id_t[:] ids, double now, int64_t prompt, int64_t bt,
                   int64_t turn=0, bint subagent=False, int64_t session=-1,
                   int8_t finish_class=RUNNING - 1, double finish_s=0.0):
        self.reserve(max(ids.shape[0] and max(ids) + 1, 1))
        self.observe(&ids[0] if ids.shape[0] else NULL, ids.shape[0], now, prompt, bt, turn,
                     subagent, session, finish_class, finish_s)

    def py_row(self, id_t k, double now):
        out = np.empty(N_FEATURES, dtype=np.float64)
        cdef double[:] o = out
        if not (k < self.n_ids and self.known[k]):
            raise KeyError(k)
        self.row(k, now, &o[0])
        return out
