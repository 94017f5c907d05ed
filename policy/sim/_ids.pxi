# Dense ids: every distinct block hash gets an int32 id in first-seen order, so per-block state
# lives in plain arrays indexed by id. Open addressing with linear probing, load <= 1/2.

cdef class Interner:
    """uint64 block hashes <-> dense ids 0..n-1 (first seen, first numbered)."""

    def __cinit__(self, Py_ssize_t expected=0):
        cdef Py_ssize_t size = 1024
        while size < 2 * expected:
            size <<= 1
        self.keys = <uint64_t*> malloc(size * sizeof(uint64_t))
        self.slots = <id_t*> malloc(size * sizeof(id_t))
        self.by_id_cap = max(1024, expected)
        self.by_id = <uint64_t*> malloc(self.by_id_cap * sizeof(uint64_t))
        if self.keys == NULL or self.slots == NULL or self.by_id == NULL:
            raise MemoryError()
        memset(self.slots, 0xff, size * sizeof(id_t))
        self.mask = size - 1
        self.n = 0

    def __dealloc__(self):
        free(self.keys)
        free(self.slots)
        free(self.by_id)

    cdef int _rehash(self) except -1:
        cdef Py_ssize_t size = 2 * (self.mask + 1), i, j
        cdef id_t* slots = <id_t*> malloc(size * sizeof(id_t))
        cdef uint64_t* keys = <uint64_t*> malloc(size * sizeof(uint64_t))
        if slots == NULL or keys == NULL:
            raise MemoryError()
        memset(slots, 0xff, size * sizeof(id_t))
        free(self.keys)
        free(self.slots)
        self.keys = keys
        self.slots = slots
        self.mask = size - 1
        for i in range(self.n):
            j = self._slot(self.by_id[i])
            while slots[j] >= 0:
                j = (j + 1) & self.mask
            slots[j] = <id_t> i
            keys[j] = self.by_id[i]
        return 0

    cdef id_t intern(self, uint64_t key) except -2:
        cdef Py_ssize_t j = self._slot(key)
        while self.slots[j] >= 0:
            if self.keys[j] == key:
                return self.slots[j]
            j = (j + 1) & self.mask
        if self.n >= 0x7FFFFFFE:
            raise OverflowError("more than 2**31 distinct blocks")
        if self.n == self.by_id_cap:
            self.by_id_cap *= 2
            self.by_id = <uint64_t*> realloc(self.by_id, self.by_id_cap * sizeof(uint64_t))
            if self.by_id == NULL:
                raise MemoryError()
        self.keys[j] = key
        self.slots[j] = <id_t> self.n
        self.by_id[self.n] = key
        self.n += 1
        if 2 * self.n > self.mask:
            self._rehash()
        return <id_t> (self.n - 1)

    cdef id_t find(self, uint64_t key):
        cdef Py_ssize_t j = self._slot(key)
        while self.slots[j] >= 0:
            if self.keys[j] == key:
                return self.slots[j]
            j = (j + 1) & self.mask
        return NONE

    def ids(self, const uint64_t[:] hashes):
        """The ids of ``hashes`` (int32), numbering new ones."""
        cdef Py_ssize_t i, m = hashes.shape[0]
        out = np.empty(m, dtype=np.int32)
        cdef id_t[:] o = out
        for i in range(m):
            o[i] = self.intern(hashes[i])
        return out

    def id_of(self, key) -> int:
        """The id of one hash, or -1 if it was never seen."""
        if not 0 <= key < 2 ** 64:
            return NONE
        return self.find(<uint64_t> key)

    def hash_of(self, Py_ssize_t i) -> int:
        if not 0 <= i < self.n:
            raise IndexError(i)
        return self.by_id[i]

    def hashes(self):
        """Every interned hash, by id (uint64)."""
        out = np.empty(self.n, dtype=np.uint64)
        cdef uint64_t[:] o = out
        cdef Py_ssize_t i
        for i in range(self.n):
            o[i] = self.by_id[i]
        return out

    def __len__(self):
        return self.n


def next_uses(const id_t[:] ids, Py_ssize_t n_ids):
    """For each reference, the index of the same block's next reference (int64; NEVER =
    2**63 - 1 when there is none): the future Belady's MIN reads. One backward pass."""
    cdef Py_ssize_t i, m = ids.shape[0]
    out = np.empty(m, dtype=np.int64)
    cdef int64_t[:] o = out
    cdef int64_t* seen = <int64_t*> malloc(max(n_ids, 1) * sizeof(int64_t))
    if seen == NULL:
        raise MemoryError()
    for i in range(n_ids):
        seen[i] = NEVER
    for i in range(m - 1, -1, -1):
        o[i] = seen[ids[i]]
        seen[ids[i]] = i
    free(seen)
    return out
