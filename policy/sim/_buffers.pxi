# Growable C arrays and intrusive doubly linked lists over dense block ids. Every per-block
# structure of the replay core is one of these: memory grows with distinct blocks only.

cdef inline id_t* grow_ids(id_t* p, Py_ssize_t old, Py_ssize_t new, id_t fill) except NULL:
    cdef id_t* q = <id_t*> realloc(p, new * sizeof(id_t))
    cdef Py_ssize_t i
    if q == NULL:
        raise MemoryError()
    for i in range(old, new):
        q[i] = fill
    return q


cdef inline int64_t* grow_i64(int64_t* p, Py_ssize_t old, Py_ssize_t new, int64_t fill) except NULL:
    cdef int64_t* q = <int64_t*> realloc(p, new * sizeof(int64_t))
    cdef Py_ssize_t i
    if q == NULL:
        raise MemoryError()
    for i in range(old, new):
        q[i] = fill
    return q


cdef inline double* grow_f64(double* p, Py_ssize_t old, Py_ssize_t new, double fill) except NULL:
    cdef double* q = <double*> realloc(p, new * sizeof(double))
    cdef Py_ssize_t i
    if q == NULL:
        raise MemoryError()
    for i in range(old, new):
        q[i] = fill
    return q


cdef inline int8_t* grow_i8(int8_t* p, Py_ssize_t old, Py_ssize_t new, int8_t fill) except NULL:
    cdef int8_t* q = <int8_t*> realloc(p, new)
    cdef Py_ssize_t i
    if q == NULL:
        raise MemoryError()
    for i in range(old, new):
        q[i] = fill
    return q


cdef inline Py_ssize_t grown(Py_ssize_t have, Py_ssize_t need):
    return max(need, 2 * have, 1024)


cdef struct Buf:
    id_t* data
    Py_ssize_t n, cap


cdef inline int buf_push(Buf* b, id_t v) except -1:
    if b.n == b.cap:
        b.cap = max(16, 2 * b.cap)
        b.data = <id_t*> realloc(b.data, b.cap * sizeof(id_t))
        if b.data == NULL:
            raise MemoryError()
    b.data[b.n] = v
    b.n += 1
    return 0


cdef inline void buf_free(Buf* b):
    free(b.data)
    b.data = NULL
    b.n = b.cap = 0


DEF MAX_LISTS = 101  # TensorRT-LLM priorities 0..100 are the most lists one structure holds


cdef class Lists:
    """Up to MAX_LISTS doubly linked lists over dense ids; an id is in at most one list.
    Head = oldest (evicted first), tail = newest."""

    cdef id_t* prev
    cdef id_t* nxt
    cdef int8_t* tag           # the list an id is in, -1: none
    cdef id_t heads[MAX_LISTS]
    cdef id_t tails[MAX_LISTS]
    cdef Py_ssize_t lens[MAX_LISTS]
    cdef Py_ssize_t n_ids

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

    cdef inline void unlink(self, id_t k):
        cdef int t = self.tag[k]
        cdef id_t p = self.prev[k]
        cdef id_t q = self.nxt[k]
        if p == NONE:
            self.heads[t] = q
        else:
            self.nxt[p] = q
        if q == NONE:
            self.tails[t] = p
        else:
            self.prev[q] = p
        self.lens[t] -= 1
        self.tag[k] = -1

    cdef inline void append(self, int t, id_t k):
        self.prev[k] = self.tails[t]
        self.nxt[k] = NONE
        if self.tails[t] == NONE:
            self.heads[t] = k
        else:
            self.nxt[self.tails[t]] = k
        self.tails[t] = k
        self.lens[t] += 1
        self.tag[k] = t

    cdef inline void to_tail(self, int t, id_t k):
        if self.tails[t] != k or self.tag[k] != t:
            if self.tag[k] >= 0:
                self.unlink(k)
            self.append(t, k)

    cdef inline id_t pop_head(self, int t):
        cdef id_t k = self.heads[t]
        self.unlink(k)
        return k

    def members(self, int t):
        """Ids of list ``t``, head first (for inspection and tests)."""
        out = []
        cdef id_t k = self.heads[t]
        while k != NONE:
            out.append(k)
            k = self.nxt[k]
        return out
