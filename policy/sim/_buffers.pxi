# Intrusive doubly linked lists over dense block ids (declared, with the growable C arrays
# every per-block structure of the replay core is made of, in _core.pxd).

cdef class Lists:
    """Up to MAX_LISTS doubly linked lists over dense ids; an id is in at most one list.
    Head = oldest (evicted first), tail = newest."""

    def __cinit__(self):
        cdef int i
        self.prev = NULL
        self.nxt = NULL
        self.tag = NULL
        self.n_ids = 0
        for i in range(MAX_LISTS):
            self.heads[i] = NONE
            self.tails[i] = NONE
            self.lens[i] = 0

    def __dealloc__(self):
        free(self.prev)
        free(self.nxt)
        free(self.tag)

    cdef int reserve(self, Py_ssize_t n) except -1:
        cdef Py_ssize_t new
        if n <= self.n_ids:
            return 0
        new = grown(self.n_ids, n)
        self.prev = grow_ids(self.prev, self.n_ids, new, NONE)
        self.nxt = grow_ids(self.nxt, self.n_ids, new, NONE)
        self.tag = grow_i8(self.tag, self.n_ids, new, -1)
        self.n_ids = new
        return 0

    def members(self, int t):
        """Ids of list ``t``, head first (for inspection and tests)."""
        out = []
        cdef id_t k = self.heads[t]
        while k != NONE:
            out.append(k)
            k = self.nxt[k]
        return out
