# Per-access eviction orders (policy/sim/policies documents each rule; the pure-Python
# versions under tests/ are the oracle they are checked against).


cdef class Lru(Tier):
    """Least recently used: the one LRU core (GPU, CPU, cold tiers, the offer tracker)."""
    cdef Lists l

    def __cinit__(self, capacity):
        self.set_capacity(capacity)
        self.l = Lists()

    cdef int _reserve(self, Py_ssize_t old, Py_ssize_t new) except -1:
        return self.l.reserve(new)

    cdef void c_store(self, id_t k, Info* info):
        self.l.append(0, k)

    cdef void c_hit(self, id_t k, Info* info):
        self.l.to_tail(0, k)

    cdef id_t c_evict(self):
        return self.l.pop_head(0)

    cdef void c_forget(self, id_t k):
        self.l.unlink(k)

    cdef inline id_t oldest(self):
        return self.l.heads[0]

    def py_order(self):
        return self.l.members(0)


DEF T1 = 0
DEF T2 = 1
DEF B1 = 0
DEF B2 = 1


cdef class Arc(Tier):
    """ARC (Megiddo & Modha) with the tier adjustments of policies/arc.py."""
    cdef Lists t                 # T1, T2: resident
    cdef Lists b                 # B1, B2: ghosts
    cdef readonly double p
    cdef bint incoming_from_b2

    def __cinit__(self, capacity):
        self.set_capacity(capacity)
        self.t = Lists()
        self.b = Lists()
        self.p = 0.0
        self.incoming_from_b2 = False

    cdef int _reserve(self, Py_ssize_t old, Py_ssize_t new) except -1:
        self.t.reserve(new)
        return self.b.reserve(new)

    cdef void c_before_insert(self, id_t k, Info* info):
        cdef int64_t c = self.capacity
        cdef double r
        cdef Py_ssize_t b1 = self.b.lens[B1], b2 = self.b.lens[B2]
        self.incoming_from_b2 = self.b.tag[k] == B2
        if c < 0:
            return
        if self.b.tag[k] == B1:
            r = (<double> b2) / b1
            self.p = min(<double> c, self.p + (r if r > 1.0 else 1.0))
        elif self.b.tag[k] == B2:
            r = (<double> b1) / b2
            self.p = max(0.0, self.p - (r if r > 1.0 else 1.0))
        elif self.t.lens[T1] + b1 >= c and b1:
            self.b.pop_head(B1)
        elif self.t.lens[T1] + self.t.lens[T2] + b1 + b2 >= 2 * c and b2:
            self.b.pop_head(B2)

    cdef void c_store(self, id_t k, Info* info):
        cdef int64_t c = self.capacity
        if self.b.tag[k] >= 0:           # remembered by a ghost list: seen before
            self.b.unlink(k)
            self.t.append(T2, k)
        else:
            self.t.append(T1, k)
        while self.b.lens[B1] and self.t.lens[T1] + self.b.lens[B1] > c:
            self.b.pop_head(B1)
        while self.b.lens[B2] and self.size + self.b.lens[B1] + self.b.lens[B2] > 2 * c:
            self.b.pop_head(B2)

    cdef void c_hit(self, id_t k, Info* info):
        self.t.to_tail(T2, k)

    cdef id_t c_evict(self):
        cdef Py_ssize_t t1 = self.t.lens[T1]
        cdef id_t k
        if t1 > 0 and (t1 > self.p or (self.incoming_from_b2 and t1 == self.p)
                       or not self.t.lens[T2]):
            k = self.t.pop_head(T1)
            self.b.append(B1, k)
        else:
            k = self.t.pop_head(T2)
            self.b.append(B2, k)
        return k

    cdef void c_forget(self, id_t k):
        self.t.unlink(k)


DEF SMALL = 0
DEF MAIN = 1
DEF GHOST = 2


cdef class S3fifo(Tier):
    """S3-FIFO (Yang et al., SOSP'23) as libCacheSim's S3FIFO.c runs it."""
    cdef Lists q
    cdef int8_t* uses
    cdef Py_ssize_t small_capacity, main_capacity, ghost_capacity
    cdef bint from_ghost, has_evicted

    def __cinit__(self, capacity):
        self.set_capacity(capacity)
        cdef int64_t c = capacity or 0
        self.small_capacity = max(1, <Py_ssize_t> (c * 0.10))
        self.main_capacity = c - self.small_capacity
        self.ghost_capacity = <Py_ssize_t> (c * 0.90)
        self.q = Lists()
        self.uses = NULL
        self.from_ghost = False
        self.has_evicted = False

    def __dealloc__(self):
        free(self.uses)

    cdef int _reserve(self, Py_ssize_t old, Py_ssize_t new) except -1:
        self.uses = grow_i8(self.uses, old, new, 0)
        return self.q.reserve(new)

    cdef void c_before_insert(self, id_t k, Info* info):
        self.from_ghost = self.q.tag[k] == GHOST
        if self.from_ghost:
            self.q.unlink(k)

    cdef void c_store(self, id_t k, Info* info):
        cdef bint warming_up = (not self.has_evicted
                                and self.q.lens[SMALL] >= self.small_capacity)
        self.uses[k] = 0
        self.q.append(MAIN if self.from_ghost or warming_up else SMALL, k)

    cdef void c_hit(self, id_t k, Info* info):
        if self.uses[k] < 100:   # only 0, 1, 2 and 3+ are ever told apart
            self.uses[k] += 1

    cdef id_t c_evict(self):
        cdef id_t v
        self.has_evicted = True
        while True:
            if self.q.lens[MAIN] > self.main_capacity or not self.q.lens[SMALL]:
                v = self._evict_main()
            else:
                v = self._evict_small()
            if v != NONE:
                return v

    cdef id_t _evict_small(self):
        cdef id_t k
        while self.q.lens[SMALL]:
            k = self.q.pop_head(SMALL)
            if self.uses[k] < 2:
                if self.ghost_capacity > 0:
                    self.q.append(GHOST, k)
                    if self.q.lens[GHOST] > self.ghost_capacity:
                        self.q.pop_head(GHOST)
                return k
            self.uses[k] = 0
            self.q.append(MAIN, k)
        return NONE

    cdef id_t _evict_main(self):
        cdef id_t k
        cdef int u
        while True:
            k = self.q.pop_head(MAIN)
            u = self.uses[k]
            if u == 0:
                return k
            self.uses[k] = (u if u < 3 else 3) - 1
            self.q.append(MAIN, k)

    cdef void c_forget(self, id_t k):
        self.q.unlink(k)


cdef class PriorityLru(Tier):
    """TensorRT-LLM's priority LRU: the lowest priority first, LRU inside one."""
    cdef Lists q

    def __cinit__(self, capacity):
        self.set_capacity(capacity)
        self.q = Lists()
        self.reads_info = True

    cdef int _reserve(self, Py_ssize_t old, Py_ssize_t new) except -1:
        return self.q.reserve(new)

    cdef void c_store(self, id_t k, Info* info):
        self.q.append(<int> info.priority, k)

    cdef void c_hit(self, id_t k, Info* info):
        self.q.unlink(k)
        self.q.append(<int> info.priority, k)

    cdef id_t c_evict(self):
        cdef int p = 0
        while self.q.lens[p] == 0:
            p += 1
        return self.q.pop_head(p)

    cdef void c_forget(self, id_t k):
        self.q.unlink(k)

    cdef int insert(self, id_t k, Info* info, Buf* victims) except -1:
        if not 0 <= info.priority <= 100:
            raise ValueError(f"priority must be in 0..100, got {info.priority}")
        return Tier.insert(self, k, info, victims)

    cdef int touch(self, id_t k, Info* info) except -1:
        if not 0 <= info.priority <= 100:
            raise ValueError(f"priority must be in 0..100, got {info.priority}")
        self.c_hit(k, info)
        return 0


cdef struct BEntry:
    int64_t neg_next
    int64_t tiebreak
    id_t key


cdef inline bint b_less(BEntry* a, BEntry* b):
    return a.neg_next < b.neg_next or (a.neg_next == b.neg_next and a.tiebreak < b.tiebreak)


cdef class Belady(Tier):
    """Belady's MIN over a lazy heap of (-next use, arrival); an entry is live while its
    block is resident with that next use (as policies/belady.py checks it)."""
    cdef BEntry* heap
    cdef Py_ssize_t hn, hcap
    cdef int64_t* next_of
    cdef int64_t tiebreak

    def __cinit__(self, capacity):
        self.set_capacity(capacity)
        self.hcap = 1024
        self.hn = 0
        self.tiebreak = 0
        self.heap = <BEntry*> malloc(self.hcap * sizeof(BEntry))
        self.next_of = NULL
        self.reads_info = True
        self.uses_future = True

    def __dealloc__(self):
        free(self.heap)
        free(self.next_of)

    cdef int _reserve(self, Py_ssize_t old, Py_ssize_t new) except -1:
        self.next_of = grow_i64(self.next_of, old, new, 0)
        return 0

    cdef void _push(self, int64_t neg_next, int64_t tb, id_t k):
        cdef Py_ssize_t i, parent
        cdef BEntry e
        if self.hn == self.hcap:
            self.hcap *= 2
            self.heap = <BEntry*> realloc(self.heap, self.hcap * sizeof(BEntry))
        e.neg_next = neg_next
        e.tiebreak = tb
        e.key = k
        i = self.hn
        self.hn += 1
        while i > 0:
            parent = (i - 1) >> 1
            if not b_less(&e, &self.heap[parent]):
                break
            self.heap[i] = self.heap[parent]
            i = parent
        self.heap[i] = e

    cdef BEntry _pop(self):
        cdef BEntry top = self.heap[0]
        cdef BEntry last
        cdef Py_ssize_t i = 0, c, n
        self.hn -= 1
        n = self.hn
        if n > 0:
            last = self.heap[n]
            while True:
                c = 2 * i + 1
                if c >= n:
                    break
                if c + 1 < n and b_less(&self.heap[c + 1], &self.heap[c]):
                    c += 1
                if not b_less(&self.heap[c], &last):
                    break
                self.heap[i] = self.heap[c]
                i = c
            self.heap[i] = last
        return top

    cdef inline bint _live(self, BEntry* e):
        return self.inside[e.key] and self.next_of[e.key] == -e.neg_next

    cdef void _set(self, id_t k, int64_t next_use):
        cdef BEntry* old
        cdef Py_ssize_t i, n
        self.next_of[k] = next_use
        self.tiebreak += 1
        self._push(-next_use, self.tiebreak, k)
        if self.hn > 4 * self.size + 1024:  # drop stale entries now and then
            old = self.heap
            n = self.hn
            self.heap = <BEntry*> malloc(self.hcap * sizeof(BEntry))
            self.hn = 0
            for i in range(n):
                if self._live(&old[i]):
                    self._push(old[i].neg_next, old[i].tiebreak, old[i].key)
            free(old)

    cdef void c_store(self, id_t k, Info* info):
        self._set(k, info.next_use)

    cdef void c_hit(self, id_t k, Info* info):
        self._set(k, info.next_use)

    cdef id_t c_evict(self):
        cdef BEntry e
        while True:
            e = self._pop()
            if self._live(&e):
                return e.key
