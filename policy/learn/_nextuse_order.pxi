# The next-use tier itself: groups by owner, the dead list, the ranked heap of groups.


cdef class NextUseOrder(Tier):
    """The learned next-use order as a tier of the protocol (exclusive flows). ``readout``:
    0 ranks by the ``q``-quantile of the time to the next use, 1 by the chance of a use
    within ``horizon_s``; ``last_block_dead``: a prompt's last block counts as dead. The
    groups are re-ranked when the clock has moved since the last eviction."""
    cdef readonly RequestSignals signals
    cdef GapTables tables
    cdef int readout
    cdef double q, horizon_s
    cdef bint last_block_dead
    cdef Lists dead                   # list 0, oldest first
    cdef int32_t* group               # per id: its owner (-1: dead or absent)
    cdef int32_t* gpos                # per id: its position in the owner's request
    cdef int32_t* members             # per request: its resident group members
    cdef id_t** slots                 # per request: members by position (NULL: none held)
    cdef int32_t* slot_cap
    cdef int32_t* top                 # per request: no member sits deeper than this
    cdef int32_t* active              # requests with members, in no order
    cdef int32_t* active_at           # per request: its index in ``active`` (-1: not there)
    cdef Py_ssize_t n_active, n_group, n_requests
    cdef NEntry* heap
    cdef Py_ssize_t hn, hcap
    cdef bint ranked
    cdef double epoch_s               # the clock when the heap was last ranked

    def __cinit__(self, capacity, RequestSignals signals, GapTables tables, int readout=0,
                  double q=0.5, double horizon_s=100.0, bint last_block_dead=False):
        cdef Py_ssize_t n = signals.n_requests
        self.set_capacity(capacity)
        if readout not in (NEXT_USE, REUSE_WITHIN):
            raise ValueError(f"readout must be 0 (next use) or 1 (reuse within), got {readout}")
        self.signals, self.tables = signals, tables
        self.readout, self.q, self.horizon_s = readout, q, horizon_s
        self.last_block_dead = last_block_dead
        self.dead = Lists()
        self.group = self.gpos = NULL
        self.n_requests = n
        self.members = <int32_t*> calloc(max(n, 1), sizeof(int32_t))
        self.slots = <id_t**> calloc(max(n, 1), sizeof(id_t*))
        self.slot_cap = <int32_t*> calloc(max(n, 1), sizeof(int32_t))
        self.top = <int32_t*> calloc(max(n, 1), sizeof(int32_t))
        self.active = <int32_t*> malloc(max(n, 1) * sizeof(int32_t))
        self.active_at = <int32_t*> malloc(max(n, 1) * sizeof(int32_t))
        self.hcap = 1024
        self.heap = <NEntry*> malloc(self.hcap * sizeof(NEntry))
        if (self.members == NULL or self.slots == NULL or self.slot_cap == NULL
                or self.top == NULL or self.active == NULL or self.active_at == NULL
                or self.heap == NULL):
            raise MemoryError()
        memset(self.active_at, 0xff, max(n, 1) * sizeof(int32_t))
        self.n_active = self.n_group = self.hn = 0
        self.ranked = False

    def __dealloc__(self):
        cdef Py_ssize_t i
        if self.slots != NULL:
            for i in range(self.n_requests):
                free(self.slots[i])
        free(self.slots)
        free(self.members)
        free(self.slot_cap)
        free(self.top)
        free(self.active)
        free(self.active_at)
        free(self.group)
        free(self.gpos)
        free(self.heap)

    def bind(self, Flow flow):
        """Join ``flow``: the signals see each request before it is served."""
        flow.observe(self.signals)

    cdef int _reserve(self, Py_ssize_t old, Py_ssize_t new) except -1:
        self.dead.reserve(new)
        self.group = <int32_t*> grow_ids(<id_t*> self.group, old, new, NONE)
        self.gpos = <int32_t*> grow_ids(<id_t*> self.gpos, old, new, 0)
        return 0

    # ---- ranking

    cdef double rank(self, int32_t o):
        """Eviction priority of owner ``o``'s group now: larger goes first."""
        cdef RequestSignals s = self.signals
        cdef GapTables g = self.tables
        cdef double now = s.now_s(), p, scale, waited, elapsed
        cdef int32_t t
        cdef Py_ssize_t k = 0, j
        if s.superseded(o):
            return INFINITY
        if now >= s.finish_s[o]:
            t, p, scale = s.table[o], s.p[o], s.scale[o]
            waited = now - s.finish_s[o]
        elif g.grid.shape[0] == 0:
            return INFINITY
        else:
            scale = s.arrival_scale[o]
            elapsed = (now - s.arrival_s[o]) / scale
            for j in range(g.grid.shape[0]):
                if g.grid[j] <= elapsed:
                    k += 1
            k = k - 1 if k > 0 else 0
            t = g.running[k]
            p = 1.0 - g.never[t]
            waited = (elapsed - g.grid[k]) * scale
        if g.length[t] < 2:
            return INFINITY
        if self.readout == NEXT_USE:
            return scale * g.conditional(t, p, waited / scale, self.q, 0.0, False)
        return -g.conditional(t, p, waited / scale, 0.0, self.horizon_s / scale, True)

    cdef int push(self, double key, int32_t o) except -1:
        cdef Py_ssize_t i, parent
        cdef NEntry e
        e.key, e.owner = key, o
        if self.hn == self.hcap:
            self.hcap *= 2
            self.heap = <NEntry*> realloc(self.heap, self.hcap * sizeof(NEntry))
            if self.heap == NULL:
                raise MemoryError()
        i = self.hn
        self.hn += 1
        while i > 0:
            parent = (i - 1) >> 1
            if not n_less(&e, &self.heap[parent]):
                break
            self.heap[i] = self.heap[parent]
            i = parent
        self.heap[i] = e
        return 0

    cdef void pop(self):
        cdef NEntry last
        cdef Py_ssize_t i = 0, c, n
        self.hn -= 1
        n = self.hn
        if n > 0:
            last = self.heap[n]
            while True:
                c = 2 * i + 1
                if c >= n:
                    break
                if c + 1 < n and n_less(&self.heap[c + 1], &self.heap[c]):
                    c += 1
                if not n_less(&self.heap[c], &last):
                    break
                self.heap[i] = self.heap[c]
                i = c
            self.heap[i] = last

    # ---- groups

    cdef int join(self, id_t k, int32_t o, int32_t pos) except -1:
        cdef int32_t cap
        if self.members[o] == 0:
            self.active_at[o] = <int32_t> self.n_active
            self.active[self.n_active] = o
            self.n_active += 1
        self.members[o] += 1
        self.n_group += 1
        self.group[k], self.gpos[k] = o, pos
        if self.slots[o] == NULL:
            cap = pos + 1 if pos >= 15 else 16
            self.slots[o] = <id_t*> malloc(cap * sizeof(id_t))
            if self.slots[o] == NULL:
                raise MemoryError()
            memset(self.slots[o], 0xff, cap * sizeof(id_t))
            self.slot_cap[o] = cap
            self.top[o] = pos
        else:
            if pos >= self.slot_cap[o]:
                cap = max(pos + 1, 2 * self.slot_cap[o])
                self.slots[o] = <id_t*> realloc(self.slots[o], cap * sizeof(id_t))
                if self.slots[o] == NULL:
                    raise MemoryError()
                memset(&self.slots[o][self.slot_cap[o]], 0xff,
                       (cap - self.slot_cap[o]) * sizeof(id_t))
                self.slot_cap[o] = cap
            if pos > self.top[o]:
                self.top[o] = pos
        self.slots[o][pos] = k
        return 0

    cdef void leave(self, id_t k):
        """Take ``k`` out of its group (its slot already cleared or cleared here)."""
        cdef int32_t o = self.group[k], last
        self.slots[o][self.gpos[k]] = NONE
        self.group[k] = NONE
        self.members[o] -= 1
        self.n_group -= 1
        if self.members[o] == 0:
            free(self.slots[o])
            self.slots[o] = NULL
            last = self.active[self.n_active - 1]
            self.active[self.active_at[o]] = last
            self.active_at[last] = self.active_at[o]
            self.active_at[o] = -1
            self.n_active -= 1

    cdef id_t pop_victim(self) except -2:
        cdef id_t victim
        cdef int32_t o, at
        cdef Py_ssize_t i
        cdef double now = self.signals.now_s()
        if self.dead.lens[0]:
            victim = self.dead.pop_head(0)
        else:
            if self.n_group == 0:
                raise KeyError("pop_victim from an empty tier")
            if not self.ranked or self.epoch_s != now:
                self.ranked, self.epoch_s = True, now
                self.hn = 0
                for i in range(self.n_active):
                    self.push(-self.rank(self.active[i]), self.active[i])
            while self.members[self.heap[0].owner] == 0:
                self.pop()
            o = self.heap[0].owner
            at = self.top[o]          # its deepest member: scan down from the deepest held
            while self.slots[o][at] == NONE:
                at -= 1
            victim = self.slots[o][at]
            self.top[o] = at
            self.leave(victim)
        self.inside[victim] = 0
        self.size -= 1
        return victim

    # ---- the protocol

    cdef int touch(self, id_t k, Info* info) except -1:
        if not self.inside[k]:
            raise KeyError(k)
        return 0

    cdef int insert(self, id_t k, Info* info, Buf* victims) except -1:
        cdef RequestSignals s = self.signals
        cdef int32_t o, pos
        cdef bint fresh
        if self.inside[k]:
            return 0
        o, pos = s.owner[k], s.position[k]
        if o < 0:
            raise ValueError(f"block id {k} was stored before any request used it")
        if s.superseded(o) or (self.last_block_dead and pos == s.blocks[o] - 1):
            self.dead.append(0, k)
        else:
            fresh = self.members[o] == 0
            self.join(k, o, pos)
            if fresh and self.ranked and self.epoch_s == s.now_s():
                self.push(-self.rank(o), o)   # ranked this epoch: add it to the heap
        self.inside[k] = 1
        self.size += 1
        if self.capacity >= 0:
            while self.size > self.capacity:
                buf_push(victims, self.pop_victim())
        return 0

    cdef int remove(self, id_t k) except -1:
        if self.dead.tag[k] >= 0:
            self.dead.unlink(k)
        else:
            self.leave(k)
        self.inside[k] = 0
        self.size -= 1
        return 0

    cdef int evict(self, Py_ssize_t n, int8_t* protected, Buf* out) except -1:
        cdef Py_ssize_t i
        if protected != NULL:
            for i in range(self.n_ids):
                if protected[i]:
                    raise ValueError("learned-next-use evicts in its own order; no protected "
                                     "blocks")
        if n > self.size:
            return 0
        for i in range(n):
            buf_push(out, self.pop_victim())
        return 1
