# The live curve's stack pieces: a block table, the instance's block ids (one probe a block
# for every structure: each indexes plain arrays by id), the recency stack (exact LRU stack
# distances over a bounded window of marks) and vLLM's file tier at one size. Included by
# _recency.pyx. Each grows with the blocks it holds, up to its limit: memory follows the
# traffic seen.

cdef int64_t FIRST_ROOM = 4096


cdef void* grown(void* p, int64_t count, size_t size) except NULL:
    cdef void* q = realloc(p, count * size)
    if q == NULL:
        raise MemoryError()
    return q


cdef inline uint64_t mixed(uint64_t x) noexcept nogil:
    # murmur3's finaliser: block hashes may be sequential ids (traces), not random bits
    x ^= x >> 33
    x *= 0xff51afd7ed558ccdULL
    x ^= x >> 33
    x *= 0xc4ceb9fe1a85ec53ULL
    x ^= x >> 33
    return x


cdef struct Entry:
    uint64_t key
    int64_t val    # EMPTY: a free slot


cdef class BlockTable:
    """uint64 key -> int64 value (>= 0); open addressing, linear probing over key-value
    pairs (one cache line a probe), deletion by backward shift (no tombstones), doubled when
    70% full."""
    cdef Entry* slots
    cdef int64_t mask
    cdef readonly int64_t n

    def __cinit__(self, int64_t expected=1024):
        cdef int64_t size = 1024
        while size * 7 < expected * 10:
            size *= 2
        self._alloc(size)

    cdef int _alloc(self, int64_t size) except -1:
        cdef int64_t i
        self.slots = <Entry*> malloc(size * sizeof(Entry))
        if self.slots == NULL:
            raise MemoryError()
        for i in range(size):
            self.slots[i].val = EMPTY
        self.mask = size - 1
        self.n = 0
        return 0

    def __dealloc__(self):
        free(self.slots)

    cdef inline int64_t slot(self, uint64_t k) noexcept nogil:
        cdef int64_t i = <int64_t> (mixed(k) & <uint64_t> self.mask)
        while self.slots[i].val != EMPTY and self.slots[i].key != k:
            i = (i + 1) & self.mask
        return i

    cdef inline int64_t get(self, uint64_t k) noexcept nogil:
        return self.slots[self.slot(k)].val

    cdef int put(self, uint64_t k, int64_t v) except -1:
        cdef int64_t i = self.slot(k)
        if self.slots[i].val == EMPTY:
            self.slots[i].key = k
            self.n += 1
            self.slots[i].val = v
            if self.n * 10 > (self.mask + 1) * 7:
                self._grow()
            return 0
        self.slots[i].val = v
        return 0

    cdef void delete(self, uint64_t k) noexcept nogil:
        cdef int64_t i = self.slot(k), j, home
        if self.slots[i].val == EMPTY:
            return
        self.n -= 1
        j = i
        while True:  # shift back every later entry of the run that may sit in the hole
            self.slots[i].val = EMPTY
            while True:
                j = (j + 1) & self.mask
                if self.slots[j].val == EMPTY:
                    return
                home = <int64_t> (mixed(self.slots[j].key) & <uint64_t> self.mask)
                if (i <= j and (home <= i or home > j)) or (i > j and home <= i and home > j):
                    break
            self.slots[i] = self.slots[j]
            i = j

    cdef int _grow(self) except -1:
        cdef Entry* old = self.slots
        cdef int64_t old_size = self.mask + 1, i
        self._alloc(2 * old_size)
        for i in range(old_size):
            if old[i].val != EMPTY:
                self.put(old[i].key, old[i].val)
        free(old)
        return 0

    cdef int64_t nbytes(self):
        return (self.mask + 1) * sizeof(Entry)


cdef class BlockIds:
    """An instance's blocks as dense ids, each held while a structure holds the block: a
    structure ``retain``s an id for each place it keeps it and ``release``s it when it lets
    it go; an id nobody holds is forgotten and its number reused. Arrays indexed by id are
    sized ``room``; the structures grow theirs to it before a request (``reserve``)."""
    cdef BlockTable table
    cdef uint64_t* hash_of
    cdef int32_t* refs
    cdef int32_t* spare
    cdef int64_t n_spare, next_id
    cdef readonly int64_t room

    def __cinit__(self):
        self.table = BlockTable(FIRST_ROOM)
        self.room = FIRST_ROOM
        self.hash_of = <uint64_t*> malloc(self.room * sizeof(uint64_t))
        self.refs = <int32_t*> calloc(self.room, sizeof(int32_t))
        self.spare = <int32_t*> malloc(self.room * sizeof(int32_t))
        if self.hash_of == NULL or self.refs == NULL or self.spare == NULL:
            raise MemoryError()
        self.n_spare = self.next_id = 0

    def __dealloc__(self):
        free(self.hash_of)
        free(self.refs)
        free(self.spare)

    cdef int32_t pinned(self, uint64_t h) except -1:
        """The id of ``h`` (a new one if none), held once more (release it after the request)."""
        cdef int64_t found = self.table.get(h)
        cdef int32_t i
        if found == EMPTY:
            if self.n_spare:
                self.n_spare -= 1
                i = self.spare[self.n_spare]
            else:
                if self.next_id == self.room:
                    self._grow()
                i = <int32_t> self.next_id
                self.next_id += 1
            self.hash_of[i] = h
            self.refs[i] = 0
            self.table.put(h, i)
        else:
            i = <int32_t> found
        self.refs[i] += 1
        return i

    cdef inline int32_t find(self, uint64_t h) noexcept nogil:
        return <int32_t> self.table.get(h)

    cdef inline void retain(self, int32_t i) noexcept nogil:
        self.refs[i] += 1

    cdef inline void release(self, int32_t i) noexcept nogil:
        self.refs[i] -= 1
        if self.refs[i] == 0:
            self.table.delete(self.hash_of[i])
            self.spare[self.n_spare] = i
            self.n_spare += 1

    cdef int _grow(self) except -1:
        self.room *= 2
        self.hash_of = <uint64_t*> grown(self.hash_of, self.room, sizeof(uint64_t))
        self.refs = <int32_t*> grown(self.refs, self.room, sizeof(int32_t))
        self.spare = <int32_t*> grown(self.spare, self.room, sizeof(int32_t))
        return 0

    @property
    def held(self) -> int:
        return self.next_id - self.n_spare

    cdef int64_t nbytes(self):
        return self.table.nbytes() + self.room * (8 + 4 + 4)


cdef int32_t* grown_ids(int32_t* p, int64_t old, int64_t new, int32_t fill) except NULL:
    cdef int32_t* q = <int32_t*> grown(p, new, sizeof(int32_t))
    cdef int64_t i
    for i in range(old, new):
        q[i] = fill
    return q


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
