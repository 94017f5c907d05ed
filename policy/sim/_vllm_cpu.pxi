# vLLM 0.33's CPU offloading cores (CPUOffloadingManager with its ``lru`` and ``arc`` cache
# policies): request-scoped. During a request, touched and stored blocks are provisional; at
# finish the request's recency is applied once, head to tail.


cdef struct PosKey:
    int64_t pos
    id_t key


cdef int cmp_pos_desc(const void* a, const void* b) noexcept nogil:
    cdef int64_t x = (<PosKey*> a).pos
    cdef int64_t y = (<PosKey*> b).pos
    return (x < y) - (x > y)


cdef class RequestBlocks:
    """A request's blocks in the order they were first touched or stored, with positions."""
    cdef PosKey* items
    cdef Py_ssize_t n, cap
    cdef bint ascending

    def __cinit__(self):
        self.cap = 256
        self.n = 0
        self.ascending = True
        self.items = <PosKey*> malloc(self.cap * sizeof(PosKey))

    def __dealloc__(self):
        free(self.items)

    cdef inline int add(self, id_t k, int64_t position) except -1:
        if self.n == self.cap:
            self.cap *= 2
            self.items = <PosKey*> realloc(self.items, self.cap * sizeof(PosKey))
            if self.items == NULL:
                raise MemoryError()
        if self.n and self.items[self.n - 1].pos >= position:
            self.ascending = False
        self.items[self.n].pos = position
        self.items[self.n].key = k
        self.n += 1
        return 0

    cdef void tail_first(self):
        """Sort by descending position (a request's tail first)."""
        cdef Py_ssize_t i = 0, j = self.n - 1
        cdef PosKey tmp
        if self.ascending:
            while i < j:
                tmp = self.items[i]
                self.items[i] = self.items[j]
                self.items[j] = tmp
                i += 1
                j -= 1
        else:
            qsort(self.items, self.n, sizeof(PosKey), cmp_pos_desc)
        self.ascending = False

    cdef inline void clear(self):
        self.n = 0
        self.ascending = True


cdef class VllmLru(Tier):
    """vLLM's LRU: each block has a rank, the lowest goes first; a request's blocks get the
    provisional rank (request, -position) and, at finish, fresh ranks tail to head. Kept as
    one list (finished blocks in rank order) plus the running request's blocks, which rank
    after every finished one, by descending position."""
    cdef Lists l
    cdef int8_t* state          # 0 out, 1 in the list, 2 provisional
    cdef int64_t* seen
    cdef int64_t stamp
    cdef RequestBlocks running

    def __cinit__(self, capacity):
        self.set_capacity(capacity)
        self.l = Lists()
        self.state = NULL
        self.seen = NULL
        self.stamp = 0
        self.running = RequestBlocks()
        self.request_scoped = True

    def __dealloc__(self):
        free(self.state)
        free(self.seen)

    cdef int _reserve(self, Py_ssize_t old, Py_ssize_t new) except -1:
        self.state = grow_i8(self.state, old, new, 0)
        self.seen = grow_i64(self.seen, old, new, 0)
        return self.l.reserve(new)

    cdef int touch(self, id_t k, Info* info) except -1:
        if self.state[k] == 1:
            self.l.unlink(k)
            self.state[k] = 2
            self.running.add(k, info.position)
        return 0

    cdef int insert(self, id_t k, Info* info, Buf* victims) except -1:
        if self.inside[k]:
            return self.touch(k, info)
        if self.capacity == 0:
            return 0
        if self.capacity >= 0 and self.size >= self.capacity:
            if not self.evict(self.size - self.capacity + 1, NULL, victims):
                return 0
        self.inside[k] = 1
        self.size += 1
        self.state[k] = 2
        self.running.add(k, info.position)
        return 0

    cdef int remove(self, id_t k) except -1:
        if self.state[k] == 1:
            self.l.unlink(k)
        self.state[k] = 0
        self.inside[k] = 0
        self.size -= 1
        return 0

    cdef int finish(self) except -1:
        cdef Py_ssize_t i
        cdef id_t k
        if self.running.n:
            self.running.tail_first()
            for i in range(self.running.n):
                k = self.running.items[i].key
                if self.state[k] == 2:
                    self.l.append(0, k)
                    self.state[k] = 1
        self.running.clear()

    cdef int evict(self, Py_ssize_t n, int8_t* protected, Buf* out) except -1:
        cdef Py_ssize_t start = out.n, i
        cdef id_t k = self.l.heads[0]
        cdef PosKey* ranked
        while k != NONE and out.n - start < n:
            if protected == NULL or not protected[k]:
                buf_push(out, k)
            k = self.l.nxt[k]
        if out.n - start < n and self.running.n:
            # the running request's own blocks rank last, tail first
            ranked = <PosKey*> malloc(self.running.n * sizeof(PosKey))
            memcpy(ranked, self.running.items, self.running.n * sizeof(PosKey))
            qsort(ranked, self.running.n, sizeof(PosKey), cmp_pos_desc)
            self.stamp += 1
            for i in range(self.running.n):
                if out.n - start >= n:
                    break
                k = ranked[i].key
                if (self.state[k] != 2 or (protected != NULL and protected[k])
                        or self.seen[k] == self.stamp):
                    continue
                self.seen[k] = self.stamp
                buf_push(out, k)
            free(ranked)
        if out.n - start < n:
            out.n = start
            return 0
        for i in range(start, out.n):
            self.remove(out.data[i])
        return 1

    def py_order(self):
        """Finished blocks, lowest rank first."""
        return self.l.members(0)


DEF IN_T1 = 0
DEF IN_T2 = 1


cdef class VllmArc(Tier):
    """ARC as vLLM's ARCCachePolicy runs it: stores go to T1; at finish a reused block moves
    T1 -> T2 (or to T2's MRU end), an insertion-only block to the MRU end of its list; a
    store miss found in ghost list B1 (B2) raises (lowers) T1's target; eviction takes from
    T1 while len(T1) >= int(target), else from T2, each falling back to the other."""
    cdef Lists t
    cdef Lists b
    cdef readonly double target_t1
    cdef int64_t* touched_at      # request serial of the first touch / store
    cdef int64_t* inserted_at
    cdef int64_t* reused_at
    cdef int64_t serial
    cdef RequestBlocks running

    def __cinit__(self, capacity):
        self.set_capacity(capacity)
        self.t = Lists()
        self.b = Lists()
        self.target_t1 = 0.0
        self.touched_at = self.inserted_at = self.reused_at = NULL
        self.serial = 1
        self.running = RequestBlocks()
        self.request_scoped = True

    def __dealloc__(self):
        free(self.touched_at)
        free(self.inserted_at)
        free(self.reused_at)

    cdef int _reserve(self, Py_ssize_t old, Py_ssize_t new) except -1:
        self.touched_at = grow_i64(self.touched_at, old, new, 0)
        self.inserted_at = grow_i64(self.inserted_at, old, new, 0)
        self.reused_at = grow_i64(self.reused_at, old, new, 0)
        self.t.reserve(new)
        return self.b.reserve(new)

    cdef inline int _note(self, id_t k, int64_t position) except -1:
        if self.touched_at[k] != self.serial:
            self.touched_at[k] = self.serial
            self.running.add(k, position)
        return 0

    cdef int touch(self, id_t k, Info* info) except -1:
        self._note(k, info.position)
        if self.inserted_at[k] != self.serial:
            self.reused_at[k] = self.serial
        return 0

    cdef int on_miss(self, Buf* keys) except -1:
        cdef Py_ssize_t i
        cdef id_t k
        cdef double cap = self.capacity if self.capacity >= 0 else INFINITY
        cdef double r
        for i in range(keys.n - 1, -1, -1):
            k = keys.data[i]
            if self.b.tag[k] == B1:
                r = (<double> self.b.lens[B2]) / self.b.lens[B1]
                self.target_t1 = min(self.target_t1 + (r if r > 1.0 else 1.0), cap)
                self.b.to_tail(B1, k)
            elif self.b.tag[k] == B2:
                r = (<double> self.b.lens[B1]) / self.b.lens[B2]
                self.target_t1 = max(self.target_t1 - (r if r > 1.0 else 1.0), 0.0)
                self.b.to_tail(B2, k)

    cdef int insert(self, id_t k, Info* info, Buf* victims) except -1:
        if self.inside[k]:
            return self.touch(k, info)
        if self.capacity == 0:
            return 0
        if self.capacity >= 0 and self.size >= self.capacity:
            if not self.evict(self.size - self.capacity + 1, NULL, victims):
                return 0
        self._note(k, info.position)
        self.inserted_at[k] = self.serial
        self.inside[k] = 1
        self.size += 1
        self.t.append(IN_T1, k)
        if self.b.tag[k] >= 0:
            self.b.unlink(k)
        return 0

    cdef int remove(self, id_t k) except -1:
        self.t.unlink(k)
        self.inside[k] = 0
        self.size -= 1
        return 0

    cdef int finish(self) except -1:
        cdef Py_ssize_t i
        cdef id_t k
        cdef bint reused, inserted
        if self.running.n:
            self.running.tail_first()
            for i in range(self.running.n):
                k = self.running.items[i].key
                if not self.inside[k]:
                    continue
                reused = self.reused_at[k] == self.serial
                inserted = self.inserted_at[k] == self.serial
                if inserted and not reused:
                    self.t.to_tail(self.t.tag[k], k)
                elif reused:
                    self.t.to_tail(IN_T2, k)
        self.running.clear()
        self.serial += 1

    cdef id_t _next_unprotected(self, id_t k, int8_t* protected):
        while k != NONE and protected != NULL and protected[k]:
            k = self.t.nxt[k]
        return k

    cdef int evict(self, Py_ssize_t n, int8_t* protected, Buf* out) except -1:
        cdef Py_ssize_t start = out.n, virtual_t1 = self.t.lens[IN_T1], i
        cdef id_t c1 = self._next_unprotected(self.t.heads[IN_T1], protected)
        cdef id_t c2 = self._next_unprotected(self.t.heads[IN_T2], protected)
        cdef id_t k
        cdef bint from_t1
        for i in range(n):
            k = NONE
            from_t1 = False
            if virtual_t1 >= <int64_t> self.target_t1 and c1 != NONE:
                k = c1
                c1 = self._next_unprotected(self.t.nxt[c1], protected)
                from_t1 = True
            if k == NONE and c2 != NONE:
                k = c2
                c2 = self._next_unprotected(self.t.nxt[c2], protected)
            if k == NONE:
                if c1 == NONE:
                    out.n = start
                    return 0
                k = c1
                c1 = self._next_unprotected(self.t.nxt[c1], protected)
                from_t1 = True
            if from_t1:
                virtual_t1 -= 1
            buf_push(out, k)
        for i in range(start, out.n):
            k = out.data[i]
            from_t1 = self.t.tag[k] == IN_T1
            self.t.unlink(k)
            self.inside[k] = 0
            self.size -= 1
            self.b.append(B1 if from_t1 else B2, k)
        if self.capacity >= 0:
            while self.b.lens[B1] > self.capacity:
                self.b.pop_head(B1)
            while self.b.lens[B2] > self.capacity:
                self.b.pop_head(B2)
        return 1

    def py_lists(self):
        """(T1, T2, B1, B2) as id lists, oldest first (for inspection and tests)."""
        return self.t.members(IN_T1), self.t.members(IN_T2), self.b.members(B1), self.b.members(B2)
