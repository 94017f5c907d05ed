# vLLM's CPU tier (its LRU, request-scoped) and file tier at one pair of sizes, fed the
# requests the GPU block pool leaves them. Included by _recency.pyx.
#
# What vLLM 0.33's offloading scheduler does with a request, as the simulator's vLLM flow
# replays it: the CPU (then file) tier serves the blocks after the GPU's hits until one is in
# neither; a file hit is staged into the CPU tier; the CPU hits are loaded (touched); then the
# store job offers the computed blocks, and the GPU hits too when the request loaded nothing
# (vLLM then stores from the first block): a block the CPU holds is a reuse, the others are
# stored if room can be made for all of them at once (else none is), and each store goes on
# to the file tier unless it holds the block. At finish the request's blocks take their
# recency, tail first. Whether a request loaded depends on the sizes, so each size is its
# own simulation.


cdef class VllmCpuTier:
    """vLLM's CPU tier (LRU) of ``capacity`` blocks, with an optional file tier."""
    cdef BlockTable where       # block -> its node
    cdef uint64_t* key
    cdef int64_t* prev
    cdef int64_t* nxt
    cdef int64_t* pos
    cdef int8_t* state          # 1: in the finished list, 2: this request's (provisional)
    cdef int8_t* guard          # held by the store call under way: not a victim
    cdef int64_t* spare         # free nodes
    cdef int64_t* running       # this request's nodes
    cdef int64_t* scratch
    cdef int64_t head, tail, n_spare, n_running, nodes
    cdef readonly int64_t capacity, size
    cdef readonly FileTierFifo files

    def __cinit__(self, int64_t capacity, int64_t file_blocks=0):
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.size = self.nodes = self.n_spare = self.n_running = 0
        self.where = BlockTable(min(capacity, FIRST_ROOM))
        self.key = NULL
        self.prev = self.nxt = self.pos = self.spare = self.running = self.scratch = NULL
        self.state = self.guard = NULL
        self._grow()
        self.head = self.tail = -1
        self.files = FileTierFifo(file_blocks) if file_blocks > 0 else None

    cdef int _grow(self) except -1:
        """More nodes (twice as many, up to ``capacity``): memory follows the blocks held."""
        cdef int64_t old = self.nodes, i
        self.nodes = min(self.capacity, max(FIRST_ROOM, 2 * old))
        self.key = <uint64_t*> grown(self.key, self.nodes, sizeof(uint64_t))
        self.prev = <int64_t*> grown(self.prev, self.nodes, sizeof(int64_t))
        self.nxt = <int64_t*> grown(self.nxt, self.nodes, sizeof(int64_t))
        self.pos = <int64_t*> grown(self.pos, self.nodes, sizeof(int64_t))
        self.state = <int8_t*> grown(self.state, self.nodes, sizeof(int8_t))
        self.guard = <int8_t*> grown(self.guard, self.nodes, sizeof(int8_t))
        self.spare = <int64_t*> grown(self.spare, self.nodes, sizeof(int64_t))
        self.running = <int64_t*> grown(self.running, self.nodes, sizeof(int64_t))
        self.scratch = <int64_t*> grown(self.scratch, self.nodes, sizeof(int64_t))
        for i in range(self.nodes - 1, old - 1, -1):
            self.state[i] = 0
            self.guard[i] = 0
            self.spare[self.n_spare] = i
            self.n_spare += 1
        return 0

    def __dealloc__(self):
        free(self.key)
        free(self.prev)
        free(self.nxt)
        free(self.pos)
        free(self.state)
        free(self.guard)
        free(self.spare)
        free(self.running)
        free(self.scratch)

    cdef int64_t nbytes(self):
        cdef int64_t total = self.where.nbytes() + self.nodes * (8 * 7 + 2)
        if self.files is not None:
            total += self.files.nbytes()
        return total

    cdef inline bint holds(self, uint64_t k) noexcept nogil:
        return self.where.get(k) != EMPTY

    cdef inline void _unlink(self, int64_t n) noexcept nogil:
        if self.prev[n] < 0:
            self.head = self.nxt[n]
        else:
            self.nxt[self.prev[n]] = self.nxt[n]
        if self.nxt[n] < 0:
            self.tail = self.prev[n]
        else:
            self.prev[self.nxt[n]] = self.prev[n]

    cdef inline void _append(self, int64_t n) noexcept nogil:
        self.prev[n] = self.tail
        self.nxt[n] = -1
        if self.tail < 0:
            self.head = n
        else:
            self.nxt[self.tail] = n
        self.tail = n

    cdef inline void touch(self, int64_t n, int64_t position) noexcept nogil:
        """Node ``n`` reused by this request (a finished block becomes this request's)."""
        if n != EMPTY and self.state[n] == 1:
            self._unlink(n)
            self.state[n] = 2
            self.pos[n] = position
            self.running[self.n_running] = n
            self.n_running += 1

    cdef int64_t store(self, const uint64_t* h, const int64_t* positions, int64_t m,
                       uint64_t* stored, int64_t* nodes) except -1:
        """vLLM's prepare_store of blocks ``h`` (at ``positions``): those held are reuses, the
        rest are stored if room can be made for all of them (victims: the finished list from
        its oldest, then this request's other blocks, tail first), else none is. Returns how
        many were stored, into ``stored``; ``nodes`` is scratch of ``m``."""
        cdef int64_t i, n, need, found = 0, new = 0, m2
        for i in range(m):
            n = nodes[i] = self.where.get(h[i])
            if n != EMPTY:
                self.touch(n, positions[i])
                self.guard[n] = 1
            else:
                new += 1
        need = new - (self.capacity - self.size)
        if need > 0:
            found = self._victims(need)
        for i in range(m):
            if nodes[i] != EMPTY:
                self.guard[nodes[i]] = 0
        if need > 0 and found < need:  # no room for all: vLLM stores none of them
            for i in range(found):
                if self.state[self.scratch[i]] == 3:
                    self.state[self.scratch[i]] = 2
            return 0
        for i in range(found):
            self._drop(self.scratch[i])
        if need > 0:  # this request's dropped blocks leave its list
            m2 = 0
            for i in range(self.n_running):
                if self.state[self.running[i]] == 2:
                    self.running[m2] = self.running[i]
                    m2 += 1
            self.n_running = m2
        new = 0
        for i in range(m):
            if nodes[i] == EMPTY:
                if self.n_spare == 0:
                    self._grow()
                n = self.spare[self.n_spare - 1]
                self.n_spare -= 1
                self.key[n] = h[i]
                self.pos[n] = positions[i]
                self.state[n] = 2
                self.where.put(h[i], n)
                self.running[self.n_running] = n
                self.n_running += 1
                self.size += 1
                stored[new] = h[i]
                new += 1
        return new

    cdef int64_t _victims(self, int64_t need) noexcept nogil:
        """Up to ``need`` victims into ``scratch``; how many were found."""
        cdef int64_t found = 0, n = self.head, i, best, j
        while n >= 0 and found < need:
            self.scratch[found] = n
            found += 1
            n = self.nxt[n]
        while found < need:  # this request's own blocks, tail first, never the store's
            best = -1
            for i in range(self.n_running):
                j = self.running[i]
                if self.state[j] == 2 and not self.guard[j] and (best < 0 or self.pos[j] > self.pos[best]):
                    best = j
            if best < 0:
                break
            self.state[best] = 3  # chosen
            self.scratch[found] = best
            found += 1
        return found

    cdef void _drop(self, int64_t n) noexcept nogil:
        if self.state[n] == 1:
            self._unlink(n)
        self.state[n] = 0
        self.where.delete(self.key[n])
        self.spare[self.n_spare] = n
        self.n_spare += 1
        self.size -= 1

    cdef void finish(self, int64_t* slots, Py_ssize_t first, Py_ssize_t cacheable) noexcept nogil:
        """The request's blocks join the finished list tail first (block 0 the newest);
        ``slots`` is scratch of ``cacheable``; every position is in ``[first, cacheable)``."""
        cdef Py_ssize_t i
        cdef int64_t n
        for i in range(first, cacheable):
            slots[i] = -1
        for i in range(self.n_running):
            n = self.running[i]
            slots[self.pos[n]] = n
        for i in range(cacheable - 1, first - 1, -1):
            n = slots[i]
            if n >= 0 and self.state[n] == 2:
                self.state[n] = 1
                self._append(n)
        self.n_running = 0

    cdef int64_t serve(self, const uint64_t* h, Py_ssize_t g, Py_ssize_t cacheable,
                       int64_t prompt, int64_t bt, int8_t* marks, int64_t* positions,
                       uint64_t* keys, uint64_t* stored, int64_t* nodes,
                       int64_t* slots) except -1:
        """One request past its ``g`` GPU hits; returns the prompt tokens the CPU and file
        tiers serve. The pointers are scratch of ``cacheable`` entries."""
        cdef Py_ssize_t nf = g, i, m = 0
        cdef int64_t served = 0, count, n
        cdef FileTierFifo files = self.files
        while nf < cacheable:  # the lookup: 0 a CPU hit, 1 a file hit
            n = self.where.get(h[nf])
            slots[nf] = n
            if n != EMPTY:
                marks[nf - g] = 0
            elif files is not None and files.holds(h[nf]):
                marks[nf - g] = 1
            else:
                break
            served += block_tokens_at(nf, prompt, bt)
            nf += 1
        for i in range(g, nf):  # file hits staged in order; what the CPU then holds loads
            if marks[i - g] == 1:
                positions[0] = i
                self.store(&h[i], positions, 1, stored, nodes)
                slots[i] = self.where.get(h[i])
            n = slots[i]
            marks[i - g] = 2 if n != EMPTY and self.state[n] != 0 and self.key[n] == h[i] else 3
        for i in range(g, nf):  # loads are touched after the staging (it may evict them)
            if marks[i - g] == 2:
                self.touch(slots[i], i)
        if nf == g:  # loaded nothing: the prompt is offered from its first block
            for i in range(g):
                keys[m] = h[i]
                positions[m] = i
                m += 1
        for i in range(nf, cacheable):
            keys[m] = h[i]
            positions[m] = i
            m += 1
        if m:
            count = self.store(keys, positions, m, stored, nodes)
            if files is not None:
                for i in range(count):
                    files.offer(stored[i])
        self.finish(slots, 0 if nf == g else g, cacheable)
        return served
