# Learned policies in array form: the offers a CPU tier receives (with features and labels)
# and the learned retention order.


DEF UNKNOWN_FINISH = 5  # FINISH_CLASSES.index("unknown")


cdef class OfferLog(OfferObserver):
    """The blocks offered to the CPU tier of an exclusive flow, in offer order.

    Kept (every ``stride``-th offer, all by default): the request it was offered in, its hash,
    its feature row (with a tracker) and its label, 1 when the block is later promoted from the
    CPU tier as a prefix hit before the tier evicted it. Streamed instead (``on_chunk``): the
    feature rows of every offer with its request index and hash, handed to ``on_chunk(X,
    requests, hashes)`` ``chunk_rows`` at a time and not kept (scoring a large replay)."""
    cdef readonly FeatureTracker tracker
    cdef object on_chunk
    cdef Py_ssize_t chunk_rows
    cdef readonly int64_t stride
    cdef readonly int64_t offers_total
    cdef int64_t* pending
    cdef Py_ssize_t n_ids
    cdef int64_t* req
    cdef id_t* key
    cdef int8_t* label
    cdef readonly Py_ssize_t n
    cdef Py_ssize_t cap
    cdef double* rows
    cdef Py_ssize_t rows_n, rows_cap
    cdef double now
    cdef Interner interner

    def __cinit__(self, FeatureTracker tracker=None, on_chunk=None, Py_ssize_t chunk_rows=1 << 18,
                  int64_t stride=1):
        if stride < 1 or chunk_rows < 1:
            raise ValueError(f"stride and chunk_rows must be >= 1, got {stride} and {chunk_rows}")
        if on_chunk is not None and tracker is None:
            raise ValueError("streaming offers needs a feature tracker")
        self.tracker = tracker
        self.on_chunk = on_chunk
        self.chunk_rows = chunk_rows
        self.stride = stride
        self.offers_total = 0
        self.pending = NULL
        self.n_ids = 0
        self.req = NULL
        self.key = NULL
        self.label = NULL
        self.n = self.cap = 0
        self.rows = NULL
        self.rows_n = self.rows_cap = 0
        self.now = 0.0
        self.interner = None

    def __dealloc__(self):
        free(self.pending)
        free(self.req)
        free(self.key)
        free(self.label)
        free(self.rows)

    cdef int reserve(self, Py_ssize_t n) except -1:
        cdef Py_ssize_t new
        if n <= self.n_ids:
            return 0
        new = grown(self.n_ids, n)
        self.pending = grow_i64(self.pending, self.n_ids, new, -1)
        if self.tracker is not None:
            self.tracker.reserve(new)
        self.n_ids = new
        return 0

    cdef int before(self, Flow flow, const id_t* hs, Py_ssize_t nb, int64_t prompt,
                    int64_t bt) except -1:
        cdef Py_ssize_t r = flow.row()
        self.interner = flow.interner
        self.now = flow.now_s()
        if self.tracker is not None:
            self.tracker.observe(hs, nb, self.now, prompt, bt,
                                 flow.turns[r] if r >= 0 and flow.turns is not None else 0,
                                 flow.subagents[r] if r >= 0 and flow.subagents is not None else 0,
                                 flow.sessions[r] if r >= 0 and flow.sessions is not None else -1,
                                 flow.finish_classes[r] if r >= 0 and flow.finish_classes is not None
                                 else UNKNOWN_FINISH,
                                 flow.finish_s[r] if r >= 0 and flow.finish_s is not None
                                 else self.now)
        return 0

    cdef int _slot(self, Flow flow, id_t k) except -1:
        cdef Py_ssize_t new
        if self.n == self.cap:
            new = grown(self.cap, self.n + 1)
            self.req = grow_i64(self.req, self.cap, new, 0)
            self.key = grow_ids(self.key, self.cap, new, 0)
            self.label = grow_i8(self.label, self.cap, new, 0)
            self.cap = new
        self.req[self.n] = flow.request_index
        self.key[self.n] = k
        self.label[self.n] = 0
        self.pending[k] = self.n
        self.n += 1
        return 0

    cdef int _row(self, id_t k) except -1:
        cdef Py_ssize_t new
        if self.rows_n == self.rows_cap:
            new = grown(self.rows_cap, self.rows_n + 1)
            if self.on_chunk is not None:
                new = self.chunk_rows
            self.rows = <double*> realloc(self.rows, new * N_FEATURES * sizeof(double))
            if self.rows == NULL:
                raise MemoryError()
            self.rows_cap = new
        self.tracker.row(k, self.now, &self.rows[self.rows_n * N_FEATURES])
        self.rows_n += 1
        return 0

    cdef int offer(self, Flow flow, id_t k) except -1:
        cdef int64_t index = self.offers_total
        self.offers_total += 1
        if self.on_chunk is not None:
            if self.rows_n == self.chunk_rows:
                self.flush()
            self._slot(flow, k)   # the chunk's request indices
            self.pending[k] = -1
            return self._row(k)
        if index % self.stride:
            self.pending[k] = -1      # a later label would land on an earlier offer's row
            return 0
        self._slot(flow, k)
        if self.tracker is not None:
            self._row(k)
        return 0

    cdef void forget(self, id_t k):
        self.pending[k] = -1

    cdef void promoted(self, id_t k, bint hit):
        if self.pending[k] >= 0:
            if hit:
                self.label[self.pending[k]] = 1
            self.pending[k] = -1

    def flush(self):
        """Hand the rows not yet handed over to ``on_chunk`` (nothing without one)."""
        cdef Py_ssize_t i
        if self.on_chunk is None or self.rows_n == 0:
            return
        X = self._rows_array().copy()
        requests = np.empty(self.n, dtype=np.int64)
        hashes = np.empty(self.n, dtype=np.uint64)
        cdef int64_t[:] rv = requests
        cdef uint64_t[:] hv = hashes
        for i in range(self.n):
            rv[i] = self.req[i]
            hv[i] = self.interner.by_id[self.key[i]]
        self.rows_n = 0
        self.n = 0
        self.on_chunk(X, requests, hashes)

    cdef object _rows_array(self):
        if self.rows_n == 0:
            return np.zeros((0, N_FEATURES))
        return np.asarray(<double[:self.rows_n, :N_FEATURES]> self.rows)

    def arrays(self):
        """(X or None, labels int8, request_index int64, block hashes uint64) of the kept
        offers (X with a tracker; streamed offers are not kept)."""
        cdef Py_ssize_t i
        if self.on_chunk is not None:
            raise ValueError("a streaming offer log keeps no offers; its rows went to on_chunk")
        labels = np.empty(self.n, dtype=np.int8)
        requests = np.empty(self.n, dtype=np.int64)
        hashes = np.empty(self.n, dtype=np.uint64)
        cdef int8_t[:] lv = labels
        cdef int64_t[:] rv = requests
        cdef uint64_t[:] hv = hashes
        for i in range(self.n):
            lv[i] = self.label[i]
            rv[i] = self.req[i]
            hv[i] = self.interner.by_id[self.key[i]] if self.interner is not None else 0
        X = self._rows_array().copy() if self.tracker is not None else None
        return X, labels, requests, hashes


DEF FLOOR = 1e-4  # a score of 0 would outrank every recency


cdef struct REntry:
    double value
    int64_t neg_position
    uint64_t hash
    id_t key


cdef inline bint r_less(REntry* a, REntry* b):
    if a.value != b.value:
        return a.value < b.value
    if a.neg_position != b.neg_position:
        return a.neg_position < b.neg_position
    return a.hash < b.hash


cdef class RetentionTracker(Observer):
    """What learned retention reads of each request before it is served: a block's last
    reference time, its position then, and the blocks seen right after it (first seen
    first)."""
    cdef double* last_s
    cdef int64_t* position
    cdef id_t* first_child
    cdef id_t* last_child
    cdef id_t* next_sibling
    cdef id_t* child_of        # the parent a block was last listed under
    cdef int8_t* seen
    cdef Py_ssize_t n_ids

    def __cinit__(self):
        self.last_s = NULL
        self.position = NULL
        self.first_child = self.last_child = self.next_sibling = self.child_of = NULL
        self.seen = NULL
        self.n_ids = 0

    def __dealloc__(self):
        free(self.last_s)
        free(self.position)
        free(self.first_child)
        free(self.last_child)
        free(self.next_sibling)
        free(self.child_of)
        free(self.seen)

    cdef int reserve(self, Py_ssize_t n) except -1:
        cdef Py_ssize_t new
        if n <= self.n_ids:
            return 0
        new = grown(self.n_ids, n)
        self.last_s = grow_f64(self.last_s, self.n_ids, new, 0.0)
        self.position = grow_i64(self.position, self.n_ids, new, 0)
        self.first_child = grow_ids(self.first_child, self.n_ids, new, NONE)
        self.last_child = grow_ids(self.last_child, self.n_ids, new, NONE)
        self.next_sibling = grow_ids(self.next_sibling, self.n_ids, new, NONE)
        self.child_of = grow_ids(self.child_of, self.n_ids, new, NONE)
        self.seen = grow_i8(self.seen, self.n_ids, new, 0)
        self.n_ids = new
        return 0

    cdef int before(self, Flow flow, const id_t* hs, Py_ssize_t nb, int64_t prompt,
                    int64_t bt) except -1:
        cdef double now = flow.now_s()
        cdef Py_ssize_t i
        cdef id_t h, p, c
        for i in range(nb):
            h = hs[i]
            self.last_s[h] = now
            self.position[h] = i
            self.seen[h] = 1
            if i:
                p = hs[i - 1]
                if self.child_of[h] != p:
                    c = self.first_child[p]
                    while c != NONE and c != h:
                        c = self.next_sibling[c]
                    if c == NONE:
                        if self.child_of[h] == NONE:   # a block listed once keeps one sibling link
                            self.next_sibling[h] = NONE
                            if self.last_child[p] == NONE:
                                self.first_child[p] = h
                            else:
                                self.next_sibling[self.last_child[p]] = h
                            self.last_child[p] = h
                        else:
                            raise ValueError("block ids are not prefix-chained: a block follows "
                                             "two different parents")
                    self.child_of[h] = p
        return 0


cdef class Retention(Tier):
    """Learned retention: evicts the lowest ``ln(max(score, FLOOR)) + last_use_s / tau_s``
    (ties: deeper in the prompt first), and a victim with a resident child gives way to its
    deepest resident descendant (first seen child first), so chains go from the tail."""
    cdef readonly RetentionTracker tracker
    cdef ScoreTable scores
    cdef readonly double tau_s
    cdef double* value_of
    cdef REntry* heap
    cdef Py_ssize_t hn, hcap
    cdef Flow flow

    def __cinit__(self, capacity, ScoreTable scores, double tau_s, RetentionTracker tracker):
        self.set_capacity(capacity)
        if not tau_s > 0:
            raise ValueError(f"tau_s must be > 0, got {tau_s!r}")
        self.scores = scores
        self.tau_s = tau_s
        self.tracker = tracker
        self.value_of = NULL
        self.hcap = 1024
        self.hn = 0
        self.heap = <REntry*> malloc(self.hcap * sizeof(REntry))
        self.flow = None

    def __dealloc__(self):
        free(self.value_of)
        free(self.heap)

    def bind(self, Flow flow):
        """Join ``flow``: its request index and ids key the scores, and the tracker sees
        each request before it is served."""
        self.flow = flow
        flow.observe(self.tracker)

    cdef int _reserve(self, Py_ssize_t old, Py_ssize_t new) except -1:
        self.value_of = grow_f64(self.value_of, old, new, 0.0)
        return self.tracker.reserve(new)

    cdef void _push(self, REntry e):
        cdef Py_ssize_t i, parent
        if self.hn == self.hcap:
            self.hcap *= 2
            self.heap = <REntry*> realloc(self.heap, self.hcap * sizeof(REntry))
        i = self.hn
        self.hn += 1
        while i > 0:
            parent = (i - 1) >> 1
            if not r_less(&e, &self.heap[parent]):
                break
            self.heap[i] = self.heap[parent]
            i = parent
        self.heap[i] = e

    cdef void _pop(self):
        cdef REntry last
        cdef Py_ssize_t i = 0, c, n
        self.hn -= 1
        n = self.hn
        if n > 0:
            last = self.heap[n]
            while True:
                c = 2 * i + 1
                if c >= n:
                    break
                if c + 1 < n and r_less(&self.heap[c + 1], &self.heap[c]):
                    c += 1
                if not r_less(&self.heap[c], &last):
                    break
                self.heap[i] = self.heap[c]
                i = c
            self.heap[i] = last

    cdef inline bint _live(self, REntry* e):
        return self.inside[e.key] and self.value_of[e.key] == e.value

    cdef void c_store(self, id_t k, Info* info):
        cdef double p = 0.5, decay = 0.0
        cdef REntry e
        cdef REntry* old
        cdef Py_ssize_t i, n
        cdef uint64_t h = self.flow.interner.by_id[k]
        self.scores.lookup(self.flow.request_index, h, &p)
        if isfinite(self.tau_s):
            decay = (self.tracker.last_s[k] if self.tracker.seen[k] else 0.0) / self.tau_s
        e.value = log(p if p > FLOOR else FLOOR) + decay
        e.neg_position = -self.tracker.position[k] if self.tracker.seen[k] else 0
        e.hash = h
        e.key = k
        self.value_of[k] = e.value
        self._push(e)
        if self.hn > 4 * self.size + 1024:  # drop stale entries now and then
            old = self.heap
            n = self.hn
            self.heap = <REntry*> malloc(self.hcap * sizeof(REntry))
            self.hn = 0
            for i in range(n):
                if self._live(&old[i]):
                    self._push(old[i])
            free(old)

    cdef id_t c_evict(self):
        cdef id_t victim, c
        while not self._live(&self.heap[0]):
            self._pop()
        victim = self.heap[0].key
        while True:   # its deepest resident descendant goes first
            c = self.tracker.first_child[victim]
            while c != NONE and not self.inside[c]:
                c = self.tracker.next_sibling[c]
            if c == NONE:
                break
            victim = c
        return victim
