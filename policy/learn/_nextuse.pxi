# The learned next-use order (policy/learn/nextuse_tier.py is its Python face; the per-key
# version under tests/ is the oracle it is checked against). Blocks are grouped by the
# request that last used them (their owner); a group is ranked by the model's readout of when
# the owner's conversation comes back, the worst group loses its deepest block first, and
# dead blocks (the chain moved on without them) go before any group.

DEF NEXT_USE = 0
DEF REUSE_WITHIN = 1


cdef class RequestSignals(Observer):
    """Per request (by replay index): arrival and finish time, the next request of its chain
    (-1: none), its block count and the model's views of it (finished: gap table, continue
    probability, gap scale; running: arrival scale). Per block: the request that last used it
    and its position there, noted before each request is served."""
    cdef const double[::1] arrival_s, finish_s, p, scale, arrival_scale
    cdef const int64_t[::1] successor, blocks
    cdef const int32_t[::1] table
    cdef readonly int64_t current            # the request being served (-1: none yet)
    cdef Py_ssize_t n_requests
    cdef int32_t* owner
    cdef int32_t* position
    cdef Py_ssize_t n_ids

    def __init__(self, arrival_s, finish_s, successor, blocks, table, p, scale, arrival_scale):
        arrays = [np.ascontiguousarray(a, dtype=d) for a, d in (
            (arrival_s, np.float64), (finish_s, np.float64), (successor, np.int64),
            (blocks, np.int64), (table, np.int32), (p, np.float64), (scale, np.float64),
            (arrival_scale, np.float64))]
        n = len(arrays[0])
        if any(len(a) != n for a in arrays):
            raise ValueError(f"request signal arrays differ in length: {[len(a) for a in arrays]}")
        (self.arrival_s, self.finish_s, self.successor, self.blocks, self.table, self.p,
         self.scale, self.arrival_scale) = arrays
        self.n_requests = n
        self.current = -1

    def __cinit__(self, *args, **kwargs):
        self.owner = self.position = NULL
        self.n_ids = 0

    def __dealloc__(self):
        free(self.owner)
        free(self.position)

    cdef int reserve(self, Py_ssize_t n) except -1:
        cdef Py_ssize_t new
        if n <= self.n_ids:
            return 0
        new = grown(self.n_ids, n)
        self.owner = <int32_t*> grow_ids(<id_t*> self.owner, self.n_ids, new, NONE)
        self.position = <int32_t*> grow_ids(<id_t*> self.position, self.n_ids, new, 0)
        self.n_ids = new
        return 0

    cdef int before(self, Flow flow, const id_t* hs, Py_ssize_t nb, int64_t prompt,
                    int64_t bt) except -1:
        cdef Py_ssize_t i
        if not 0 <= flow.request_index < self.n_requests:
            raise ValueError(f"request {flow.request_index} has no signals (the signals cover "
                             f"{self.n_requests} requests)")
        self.current = flow.request_index
        for i in range(nb):
            self.owner[hs[i]] = <int32_t> self.current
            self.position[hs[i]] = <int32_t> i
        return 0

    def py_before(self, int64_t index, ids):
        """What a flow does before serving request ``index`` with block ``ids`` (per-key use
        and tests)."""
        cdef Py_ssize_t i
        if not 0 <= index < self.n_requests:
            raise ValueError(f"request {index} has no signals (the signals cover "
                             f"{self.n_requests} requests)")
        ids = list(ids)
        self.reserve(max(ids, default=-1) + 1)
        self.current = index
        for i, k in enumerate(ids):
            self.owner[<id_t> k] = <int32_t> index
            self.position[<id_t> k] = <int32_t> i

    cdef inline bint superseded(self, int32_t r):
        """Whether a later request of its chain has arrived."""
        cdef int64_t s = self.successor[r]
        return 0 <= s <= self.current

    cdef inline double now_s(self):
        return self.arrival_s[self.current] if self.current >= 0 else 0.0


cdef class GapTables:
    """The model's gap tables as rows of quantiles (``lengths``: how many each holds; a
    table of fewer than 2 ranks its groups first), the share that never continued, and the
    running grid: normalised elapsed times and the table read at each (none: a running
    request's group ranks first)."""
    cdef const double[:, ::1] q
    cdef const int32_t[::1] length
    cdef const double[::1] never
    cdef const double[::1] grid
    cdef const int32_t[::1] running

    def __init__(self, quantiles, lengths, never, grid, running):
        q = np.ascontiguousarray(quantiles, dtype=np.float64)
        length = np.ascontiguousarray(lengths, dtype=np.int32)
        never_ = np.ascontiguousarray(never, dtype=np.float64)
        grid_ = np.ascontiguousarray(grid, dtype=np.float64)
        running_ = np.ascontiguousarray(running, dtype=np.int32)
        n = q.shape[0]
        if q.ndim != 2 or len(length) != n or len(never_) != n:
            raise ValueError("gap table arrays differ in length")
        if len(running_) != len(grid_):
            raise ValueError("the running grid needs one table per elapsed time")
        if ((running_ < 0) | (running_ >= n)).any() or ((length < 0) | (length > q.shape[1])
                                                         ).any():
            raise ValueError("a running entry or a table length is out of range")
        self.q, self.length, self.never, self.grid, self.running = (q, length, never_, grid_,
                                                                    running_)

    cdef double cdf(self, int32_t t, double x):
        """P(gap <= x | continued), piecewise linear between quantiles."""
        cdef Py_ssize_t n = self.length[t], lo = 0, hi, mid
        cdef const double* q = &self.q[t, 0]
        cdef double frac
        if n == 0 or x < q[0]:
            return 0.0
        if x >= q[n - 1]:
            return 1.0
        hi = n
        while lo < hi:  # bisect_right
            mid = (lo + hi) // 2
            if x < q[mid]:
                hi = mid
            else:
                lo = mid + 1
        lo -= 1
        frac = (x - q[lo]) / (q[lo + 1] - q[lo]) if q[lo + 1] > q[lo] else 1.0
        return (<double> lo + frac) / <double> (n - 1)

    cdef double inverse(self, int32_t t, double u):
        cdef Py_ssize_t n = self.length[t], i
        cdef const double* q = &self.q[t, 0]
        if 0.0 > u:
            u = 0.0
        if 1.0 < u:
            u = 1.0
        u = u * <double> (n - 1)
        i = <Py_ssize_t> u
        if n - 2 < i:
            i = n - 2
        return q[i] + (u - <double> i) * (q[i + 1] - q[i])

    cdef double conditional(self, int32_t t, double p, double e, double u, double horizon,
                            bint within):
        """Given waited ``e``: ``within``, P(next use within ``horizon``); else the
        ``u``-quantile of the remaining time (inf when the chain more likely never comes)."""
        cdef double f0 = self.cdf(t, e), survive, target, x
        survive = 1.0 - p * f0
        if survive <= 1e-12:
            return 1.0 if within else 0.0
        if within:
            return p * (self.cdf(t, e + horizon) - f0) / survive
        if not p > 0:
            return INFINITY
        target = f0 + u * survive / p
        if target > 1.0:
            return INFINITY
        x = self.inverse(t, target) - e
        return x if x > 0.0 else 0.0


cdef struct NEntry:
    double key        # minus the rank: the smallest goes first
    int32_t owner


cdef inline bint n_less(NEntry* a, NEntry* b):
    if a.key != b.key:
        return a.key < b.key
    return a.owner < b.owner


include "_nextuse_order.pxi"


def deepest_seen(const uint64_t[:] hashes, const int64_t[:] offsets):
    """Per request, its deepest leading block that an earlier request used: the latest such
    request and the block's position there (int64 arrays; -1 where no leading block was
    seen). How a request without a session id finds the chat it continues."""
    cdef Py_ssize_t r, i, n = offsets.shape[0] - 1
    cdef Interner interner = Interner(hashes.shape[0] // 4)
    cdef id_t k, deepest
    cdef int64_t* last_pos = NULL
    cdef int64_t* last_req = NULL
    cdef Py_ssize_t have = 0
    owners = np.full(max(n, 0), -1, dtype=np.int64)
    positions = np.full(max(n, 0), -1, dtype=np.int64)
    cdef int64_t[:] o = owners, p = positions
    try:
        for r in range(n):
            deepest = NONE
            for i in range(offsets[r], offsets[r + 1]):
                k = interner.intern(hashes[i])
                if k >= have:
                    last_req = grow_i64(last_req, have, grown(have, k + 1), -1)
                    last_pos = grow_i64(last_pos, have, grown(have, k + 1), -1)
                    have = grown(have, k + 1)
                if last_req[k] < 0:
                    break
                deepest = k
            if deepest != NONE:
                o[r], p[r] = last_req[deepest], last_pos[deepest]
            for i in range(offsets[r], offsets[r + 1]):
                k = interner.intern(hashes[i])
                if k >= have:
                    last_req = grow_i64(last_req, have, grown(have, k + 1), -1)
                    last_pos = grow_i64(last_pos, have, grown(have, k + 1), -1)
                    have = grown(have, k + 1)
                last_req[k] = r
                last_pos[k] = i - offsets[r]
    finally:
        free(last_req)
        free(last_pos)
    return owners, positions
