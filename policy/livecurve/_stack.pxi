# The live curve's stack pieces: the recency stack (exact LRU stack distances over a bounded
# window of marks) and vLLM's file tier at one size, both indexing arrays by the instance's
# block ids (_block_ids.pxi). Included by _recency.pyx. Each grows with the blocks it holds,
# up to its limit: memory follows the traffic seen.


cdef class RecencyStack:
    """The most recent ``limit`` marks of one access stream (block ids of ``ids``) and their
    stack distances."""
    cdef BlockIds ids
    cdef int32_t* stamp         # per id: the time of its current mark, -1: none
    cdef int64_t n_stamp
    cdef int* tree              # Fenwick tree over times 0..cap-1 (1-based inside)
    cdef int32_t* owner         # the id each time's mark belongs to
    cdef int8_t* state          # 0: no mark, 1: a block's current mark, 2: an old copy's
    cdef int64_t cap, most, top, oldest
    cdef readonly int64_t live, limit

    def __cinit__(self, int64_t limit, BlockIds ids=None):
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        self.ids = ids if ids is not None else BlockIds()
        self.limit = limit
        self.most = 2 * limit + 1024  # the time line's length at most: room to compact into
        self.cap = min(self.most, FIRST_ROOM)
        self.tree = <int*> calloc(self.cap + 1, sizeof(int))
        self.owner = <int32_t*> malloc(self.cap * sizeof(int32_t))
        self.state = <int8_t*> calloc(self.cap, sizeof(int8_t))
        self.stamp = NULL
        self.n_stamp = 0
        if self.tree == NULL or self.owner == NULL or self.state == NULL:
            raise MemoryError()
        self.top = self.oldest = self.live = 0
        self.reserve()

    def __dealloc__(self):
        free(self.tree)
        free(self.owner)
        free(self.state)
        free(self.stamp)

    cdef int reserve(self) except -1:
        if self.n_stamp < self.ids.room:
            self.stamp = grown_ids(self.stamp, self.n_stamp, self.ids.room, -1)
            self.n_stamp = self.ids.room
        return 0

    cdef inline void _add(self, int64_t t, int v) noexcept nogil:
        cdef int64_t i = t + 1
        while i <= self.cap:
            self.tree[i] += v
            i += i & -i

    cdef inline int64_t _upto(self, int64_t t) noexcept nogil:
        cdef int64_t i = t + 1, total = 0
        while i > 0:
            total += self.tree[i]
            i -= i & -i
        return total

    cdef inline int64_t distance(self, int32_t k) noexcept nogil:
        cdef int64_t t = self.stamp[k]
        if t < 0:
            return FAR
        return self.live - self._upto(t) + 1

    cdef int access(self, int32_t k) except -1:
        """``k`` used now: its mark moves to the top."""
        cdef int64_t t = self.stamp[k]
        if t >= 0:
            self._add(t, -1)
            self.state[t] = 0
            self.live -= 1
        else:
            self.ids.retain(k)  # its mark holds it
        return self._push(k)

    cdef int copy(self, int32_t k) except -1:
        """``k`` written again into a fresh slot: its old copy keeps its place (and room)."""
        cdef int64_t t = self.stamp[k]
        if t >= 0:
            self.state[t] = 2
        self.ids.retain(k)  # the new copy's mark
        return self._push(k)

    cdef int _push(self, int32_t k) except -1:
        cdef int64_t t
        if self.top == self.cap:
            self._compact()
        t = self.top
        self.top += 1
        self._add(t, 1)
        self.owner[t] = k
        self.state[t] = 1
        self.stamp[k] = <int32_t> t
        self.live += 1
        while self.live > self.limit:  # the oldest mark misses at every size asked
            while self.state[self.oldest] == 0:
                self.oldest += 1
            if self.state[self.oldest] == 1:
                self.stamp[self.owner[self.oldest]] = -1
            self._add(self.oldest, -1)
            self.state[self.oldest] = 0
            self.live -= 1
            self.ids.release(self.owner[self.oldest])
            self.oldest += 1
        return 0

    cdef int _compact(self) except -1:
        """Renumber the live marks from 0; first a longer time line when they fill half."""
        cdef int64_t j = 0, t, parent
        if 2 * self.live > self.cap and self.cap < self.most:
            self.cap = min(2 * self.cap, self.most)
            self.tree = <int*> grown(self.tree, self.cap + 1, sizeof(int))
            self.owner = <int32_t*> grown(self.owner, self.cap, sizeof(int32_t))
            self.state = <int8_t*> grown(self.state, self.cap, sizeof(int8_t))
        for t in range(self.oldest, self.top):
            if self.state[t]:
                self.owner[j] = self.owner[t]
                self.state[j] = self.state[t]
                if self.state[j] == 1:
                    self.stamp[self.owner[j]] = <int32_t> j
                j += 1
        memset(&self.state[j], 0, (self.cap - j) * sizeof(int8_t))
        memset(self.tree, 0, (self.cap + 1) * sizeof(int))
        for t in range(1, self.cap + 1):  # a tree of j ones, built in linear time
            if t <= j:
                self.tree[t] += 1
            parent = t + (t & -t)
            if parent <= self.cap:
                self.tree[parent] += self.tree[t]
        self.top, self.oldest = j, 0
        return 0

    cdef int64_t nbytes(self):
        return (self.cap + 1) * sizeof(int) + self.cap * (sizeof(int32_t) + sizeof(int8_t)) \
            + self.n_stamp * sizeof(int32_t)

    def use(self, uint64_t block) -> None:
        """Use ``block`` (tests drive the stack block by block)."""
        cdef int32_t k = self.ids.pinned(block)
        self.reserve()
        self.access(k)
        self.ids.release(k)

    def distance_of(self, uint64_t block):
        """The stack distance of ``block`` (``None``: not held)."""
        cdef int32_t k = self.ids.find(block)
        if k < 0:
            return None
        cdef int64_t d = self.distance(k)
        return None if d == FAR else d

    @property
    def held_ids(self) -> int:
        return self.ids.held


cdef class FileTierFifo:
    """vLLM's file tier at one size: it stores each block offered unless it holds it, and
    drops the oldest store first (a hit does not refresh a file)."""
    cdef BlockIds ids
    cdef int64_t* stored        # per id: its store number, -1: not stored
    cdef int64_t n_stored
    cdef int32_t* ring          # the last ``size`` ids stored, by store number
    cdef int64_t room           # the ring's length so far (it grows to ``size``)
    cdef readonly int64_t size, count

    def __cinit__(self, int64_t size, BlockIds ids):
        if size < 1:
            raise ValueError(f"size must be >= 1, got {size}")
        self.ids = ids
        self.size = size
        self.count = 0
        self.room = min(size, FIRST_ROOM)
        self.ring = <int32_t*> malloc(self.room * sizeof(int32_t))
        self.stored = NULL
        self.n_stored = 0
        if self.ring == NULL:
            raise MemoryError()
        self.reserve()

    def __dealloc__(self):
        free(self.ring)
        free(self.stored)

    cdef int reserve(self) except -1:
        cdef int64_t i
        if self.n_stored < self.ids.room:
            self.stored = <int64_t*> grown(self.stored, self.ids.room, sizeof(int64_t))
            for i in range(self.n_stored, self.ids.room):
                self.stored[i] = -1
            self.n_stored = self.ids.room
        return 0

    cdef inline bint holds(self, int32_t k) noexcept nogil:
        return self.stored[k] >= 0

    cdef int offer(self, int32_t k) except -1:
        cdef int64_t slot
        cdef int32_t old
        if self.stored[k] >= 0:
            return 0
        if self.count == self.room and self.room < self.size:  # still filling: no wrap yet
            self.room = min(2 * self.room, self.size)
            self.ring = <int32_t*> grown(self.ring, self.room, sizeof(int32_t))
        slot = self.count % self.size
        if self.count >= self.size:  # the oldest file goes
            old = self.ring[slot]
            self.stored[old] = -1
            self.ids.release(old)
        self.ring[slot] = k
        self.stored[k] = self.count
        self.ids.retain(k)
        self.count += 1
        return 0

    cdef int64_t nbytes(self):
        return self.room * sizeof(int32_t) + self.n_stored * sizeof(int64_t)
