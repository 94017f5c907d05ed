# The instance's blocks as dense ids: the one hash table (open addressing over key-value
# pairs) and the ids every structure indexes its arrays by. Included by _recency.pyx.

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
