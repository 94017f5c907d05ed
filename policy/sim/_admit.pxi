# Admission: whether an offered block gets a slot. ``admit`` sees the flow (residency, the
# request being served) and the block's info; ``reads_info`` says whether it reads the info.


cdef class Admitter:
    def __cinit__(self, *args, **kwargs):
        self.reads_info = False
        self.observer = None

    cdef int reserve(self, Py_ssize_t n) except -1:
        return 0

    cdef int admit(self, Flow flow, id_t k, Info* info) except -1:
        return 1


cdef class StoreThreshold(Admitter):
    """vLLM's ``store_threshold``: a block is stored once it has been offered ``threshold``
    times (0 or 1: always). Offers are counted in an LRU-bounded tracker of ``max_tracked``
    blocks (vLLM's ``max_tracker_size``) that never forgets a block of the offer being
    counted; a forgotten block starts again."""
    cdef readonly int64_t threshold, max_tracked
    cdef Lru tracker
    cdef int64_t* offers
    cdef int8_t* counting
    cdef Py_ssize_t n_ids
    cdef Buf scratch

    def __cinit__(self, int64_t threshold, int64_t max_tracked=64000):
        if threshold < 0 or max_tracked <= 0:
            raise ValueError(f"store_threshold must be >= 0 and max_tracked > 0, got "
                             f"{threshold} and {max_tracked}")
        self.threshold = threshold
        self.max_tracked = max_tracked
        self.tracker = Lru(None)
        self.offers = NULL
        self.counting = NULL
        self.n_ids = 0
        memset(&self.scratch, 0, sizeof(Buf))

    def __dealloc__(self):
        free(self.offers)
        free(self.counting)
        buf_free(&self.scratch)

    cdef int reserve(self, Py_ssize_t n) except -1:
        cdef Py_ssize_t new
        if n <= self.n_ids:
            return 0
        new = grown(self.n_ids, n)
        self.offers = grow_i64(self.offers, self.n_ids, new, 0)
        self.counting = grow_i8(self.counting, self.n_ids, new, 0)
        self.tracker.reserve(new)
        self.n_ids = new
        return 0

    cdef int count(self, const id_t* keys, Py_ssize_t n) except -1:
        """One offer of ``keys`` (a request's blocks offered together)."""
        cdef Py_ssize_t i, kept = 0, unprotected
        cdef id_t k
        cdef Info info
        cdef Lru tr = self.tracker
        if self.threshold < 2:
            return 0
        self.scratch.n = 0
        for i in range(n):
            k = keys[i]
            if tr.inside[k]:
                tr.c_hit(k, &info)
                self.offers[k] += 1
                if not self.counting[k]:
                    self.counting[k] = 1
                    buf_push(&self.scratch, k)
                    kept += 1
        unprotected = tr.size - kept
        for i in range(n):
            k = keys[i]
            if tr.inside[k]:
                continue
            if tr.size >= self.max_tracked:
                if unprotected == 0:
                    continue
                self.offers[tr.oldest()] = 0
                tr.remove(tr.oldest())
                unprotected -= 1
            tr.insert(k, &info, NULL)
            self.offers[k] = 1
        for i in range(self.scratch.n):
            self.counting[self.scratch.data[i]] = 0
        return 0

    cdef inline bint passes(self, id_t k):
        return self.threshold < 2 or self.offers[k] >= self.threshold

    cdef int admit(self, Flow flow, id_t k, Info* info) except -1:
        self.count(&k, 1)
        return self.passes(k)

    def py_count(self, ids):
        """One offer of ``ids`` together."""
        cdef Buf keys
        memset(&keys, 0, sizeof(Buf))
        try:
            for k in ids:
                self.reserve(k + 1)
                buf_push(&keys, k)
            self.count(keys.data, keys.n)
        finally:
            buf_free(&keys)

    def py_passes(self, id_t k) -> bool:
        return self.threshold < 2 or (k < self.n_ids and self.offers[k] >= self.threshold)


cdef class Sightings(Observer):
    """Counts each request's blocks, before it is served, as one offer to a tracker."""
    cdef StoreThreshold tracker

    def __cinit__(self, StoreThreshold tracker):
        self.tracker = tracker

    cdef int reserve(self, Py_ssize_t n) except -1:
        return self.tracker.reserve(n)

    cdef int before(self, Flow flow, const id_t* hs, Py_ssize_t nb, int64_t prompt,
                    int64_t bt) except -1:
        return self.tracker.count(hs, nb)


cdef class SightingFilter(Admitter):
    """Admission on sightings: a block is admitted on the ``threshold``-th request that
    references it (0 or 1: always). Each request counts once for each of its blocks, hits
    included, in vLLM's tracker (:class:`StoreThreshold`, ``max_tracked`` blocks, the
    least recently seen forgotten first); the flow counts a request before serving it."""
    cdef readonly StoreThreshold tracker

    def __cinit__(self, int64_t threshold, int64_t max_tracked=64000):
        self.tracker = StoreThreshold(threshold, max_tracked)
        self.observer = Sightings(self.tracker)

    cdef int reserve(self, Py_ssize_t n) except -1:
        return self.tracker.reserve(n)

    cdef int admit(self, Flow flow, id_t k, Info* info) except -1:
        return self.tracker.passes(k)


cdef class PriorityGate(Admitter):
    """TensorRT-LLM's offload gate: ``priority >= min_priority`` (``gt``: ``>``)."""
    cdef readonly int64_t min_priority
    cdef readonly bint gt

    def __cinit__(self, int64_t min_priority, bint gt=False):
        self.min_priority = min_priority
        self.gt = gt
        self.reads_info = True

    cdef int admit(self, Flow flow, id_t k, Info* info) except -1:
        return info.priority > self.min_priority if self.gt else info.priority >= self.min_priority


cdef class ScoreTable(Admitter):
    """A learned model's score per offer, keyed by (request index, block hash); an offer is
    admitted when its score is >= ``threshold``, an offer without a score is admitted and
    counted in ``misses``. ``chained``: a block whose parent prefix no tier holds (GPU or
    CPU) is refused whatever its score."""
    def __cinit__(self, requests, hashes, scores, double threshold, bint chained=True):
        self.requests = requests
        self.hashes = hashes
        self.scores = scores
        self.threshold = threshold
        self.chained = chained
        self.misses = 0
        self.at_request = -1
        self.lo = self.hi = 0

    cdef void _seek(self, int64_t request):
        cdef Py_ssize_t lo = 0, hi = self.requests.shape[0], mid
        while lo < hi:
            mid = (lo + hi) >> 1
            if self.requests[mid] < request:
                lo = mid + 1
            else:
                hi = mid
        self.lo = lo
        hi = self.requests.shape[0]
        while lo < hi:
            mid = (lo + hi) >> 1
            if self.requests[mid] <= request:
                lo = mid + 1
            else:
                hi = mid
        self.hi = lo
        self.at_request = request

    cdef bint lookup(self, int64_t request, uint64_t h, double* score):
        """The score of block ``h`` offered during ``request``; False when there is none."""
        cdef Py_ssize_t lo, hi, mid
        if request != self.at_request:
            self._seek(request)
        lo = self.lo
        hi = self.hi
        while lo < hi:
            mid = (lo + hi) >> 1
            if self.hashes[mid] < h:
                lo = mid + 1
            else:
                hi = mid
        if lo < self.hi and self.hashes[lo] == h:
            score[0] = self.scores[lo]
            return True
        return False

    cdef int admit(self, Flow flow, id_t k, Info* info) except -1:
        cdef id_t parent
        cdef double score
        if self.chained:
            parent = flow.parent_of(k)
            if parent != NONE and not flow.held_above_cold(parent):
                return 0
        if self.lookup(flow.request_index, flow.interner.by_id[k], &score):
            return score >= self.threshold
        self.misses += 1
        return 1


cdef class PySightings(Observer):
    """Tells a Python admitter each request's block hashes (its ``sight``) before serving."""
    cdef object sight

    def __cinit__(self, sight):
        self.sight = sight

    cdef int before(self, Flow flow, const id_t* hs, Py_ssize_t nb, int64_t prompt,
                    int64_t bt) except -1:
        self.sight([flow.interner.by_id[hs[i]] for i in range(nb)])
        return 0


cdef class PyAdmitter(Admitter):
    """Any Python admitter (``admit(block_hash, info) -> bool``), called per offer; one
    that counts requests (``sight(hashes)``) is told each request's blocks first."""
    cdef object target
    cdef object info_type

    def __cinit__(self, target, info_type, bint reads_info=True):
        self.target = target
        self.info_type = info_type
        self.reads_info = reads_info
        sight = getattr(target, "sight", None)
        if sight is not None:
            self.observer = PySightings(sight)

    cdef int admit(self, Flow flow, id_t k, Info* info) except -1:
        next_use = float("inf") if info.next_use == NEVER else info.next_use
        return bool(self.target.admit(flow.interner.by_id[k],
                                      self.info_type(info.priority, next_use, info.position)))


cdef class ReusedLater(Admitter):
    """A diagnostic: admits an offer iff its block is referenced by a later request (the
    last request referencing each block is given by id), chained like ScoreTable."""
    cdef const int64_t[:] last_request
    cdef readonly bint chained

    def __cinit__(self, last_request, bint chained=True):
        self.last_request = last_request
        self.chained = chained

    cdef int admit(self, Flow flow, id_t k, Info* info) except -1:
        cdef id_t parent
        if self.chained:
            parent = flow.parent_of(k)
            if parent != NONE and not flow.held_above_cold(parent):
                return 0
        return k < self.last_request.shape[0] and self.last_request[k] > flow.request_index


def last_requests(const id_t[:] ids, const int64_t[:] offsets, Py_ssize_t n_ids):
    """For each id, the index of the last request that references it (-1: none)."""
    out = np.full(n_ids, -1, dtype=np.int64)
    cdef int64_t[:] o = out
    cdef Py_ssize_t r, i
    for r in range(offsets.shape[0] - 1):
        for i in range(offsets[r], offsets[r + 1]):
            o[ids[i]] = r
    return out


cdef struct HashAt:
    uint64_t hash
    int64_t at


cdef int cmp_hash_at(const void* a, const void* b) noexcept nogil:
    cdef HashAt* x = <HashAt*> a
    cdef HashAt* y = <HashAt*> b
    if x.hash != y.hash:
        return -1 if x.hash < y.hash else 1
    return (x.at > y.at) - (x.at < y.at)


def sort_scores(int32_t[:] requests, uint64_t[:] hashes, double[:] scores):
    """Offers' scores in offer order (``requests`` non-decreasing) sorted in place by block
    within each request, a repeated offer keeping its last score: the order ScoreTable reads.
    Returns how many entries remain (the arrays' leading part)."""
    cdef Py_ssize_t n = requests.shape[0], lo = 0, hi, i, w = 0, m
    cdef HashAt* buf = NULL
    cdef double* vals = NULL
    cdef Py_ssize_t cap = 0
    try:
        while lo < n:
            hi = lo + 1
            while hi < n and requests[hi] == requests[lo]:
                hi += 1
            if hi < n and requests[hi] < requests[lo]:
                raise ValueError("offers must come in request order")
            m = hi - lo
            if m > cap:
                cap = 2 * m
                buf = <HashAt*> realloc(buf, cap * sizeof(HashAt))
                vals = <double*> realloc(vals, cap * sizeof(double))
                if buf == NULL or vals == NULL:
                    raise MemoryError()
            for i in range(m):
                buf[i].hash = hashes[lo + i]
                buf[i].at = i
                vals[i] = scores[lo + i]
            qsort(buf, m, sizeof(HashAt), cmp_hash_at)
            for i in range(m):
                if i + 1 < m and buf[i + 1].hash == buf[i].hash:
                    continue  # a later offer of the same block in the same request wins
                requests[w] = requests[lo]
                hashes[w] = buf[i].hash
                scores[w] = vals[buf[i].at]
                w += 1
            lo = hi
    finally:
        free(buf)
        free(vals)
    return w
