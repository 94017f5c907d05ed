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
# own simulation; all of them index plain arrays by the instance's block ids.

DEF OUT = 0        # not in the tier
DEF FINISHED = 1   # in the finished list (LRU order)
DEF RUNNING = 2    # this request's: provisional recency
DEF CHOSEN = 3     # this request's, chosen as a victim of the store under way


cdef class VllmCpuTier:
    """vLLM's CPU tier (LRU) of ``capacity`` blocks, with an optional file tier."""
    cdef BlockIds ids
    cdef int32_t* prev
    cdef int32_t* nxt
    cdef int32_t* pos
    cdef int8_t* state
    cdef int8_t* guard          # held by the store call under way: not a victim
    cdef int64_t n_room
    cdef int32_t* running       # this request's ids
    cdef int32_t* scratch
    cdef int64_t run_room
    cdef int32_t head, tail
    cdef int64_t n_running
    cdef readonly int64_t capacity, size
    cdef readonly FileTierFifo files

    def __cinit__(self, int64_t capacity, BlockIds ids, int64_t file_blocks=0):
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.ids = ids
        self.capacity = capacity
        self.size = self.n_running = self.n_room = self.run_room = 0
        self.prev = self.nxt = self.pos = self.running = self.scratch = NULL
        self.state = self.guard = NULL
        self.head = self.tail = -1
        self.files = FileTierFifo(file_blocks, ids) if file_blocks > 0 else None
        self.reserve(1)

    def __dealloc__(self):
        free(self.prev)
        free(self.nxt)
        free(self.pos)
        free(self.state)
        free(self.guard)
        free(self.running)
        free(self.scratch)

    cdef int reserve(self, int64_t blocks) except -1:
        """Arrays for every id, and room for a request of ``blocks`` blocks."""
        cdef int64_t room = self.ids.room
        if self.n_room < room:
            self.prev = <int32_t*> grown(self.prev, room, sizeof(int32_t))
            self.nxt = <int32_t*> grown(self.nxt, room, sizeof(int32_t))
            self.pos = <int32_t*> grown(self.pos, room, sizeof(int32_t))
            self.state = <int8_t*> grown(self.state, room, sizeof(int8_t))
            self.guard = <int8_t*> grown(self.guard, room, sizeof(int8_t))
            memset(&self.state[self.n_room], 0, room - self.n_room)
            memset(&self.guard[self.n_room], 0, room - self.n_room)
            self.n_room = room
        if self.files is not None:
            self.files.reserve()
        if self.run_room < blocks + 1:
            self.run_room = max(2 * self.run_room, blocks + 1, 256)
            self.running = <int32_t*> grown(self.running, self.run_room, sizeof(int32_t))
            self.scratch = <int32_t*> grown(self.scratch, self.run_room, sizeof(int32_t))
        return 0

    cdef int64_t nbytes(self):
        cdef int64_t total = self.n_room * (4 * 3 + 2) + self.run_room * 8
        if self.files is not None:
            total += self.files.nbytes()
        return total

    cdef inline bint holds(self, int32_t k) noexcept nogil:
        return self.state[k] != OUT

    cdef inline void _unlink(self, int32_t n) noexcept nogil:
        if self.prev[n] < 0:
            self.head = self.nxt[n]
        else:
            self.nxt[self.prev[n]] = self.nxt[n]
        if self.nxt[n] < 0:
            self.tail = self.prev[n]
        else:
            self.prev[self.nxt[n]] = self.prev[n]

    cdef inline void _append(self, int32_t n) noexcept nogil:
        self.prev[n] = self.tail
        self.nxt[n] = -1
        if self.tail < 0:
            self.head = n
        else:
            self.nxt[self.tail] = n
        self.tail = n

    cdef inline void touch(self, int32_t n, int64_t position) noexcept nogil:
        """A finished block reused by this request becomes this request's."""
        if self.state[n] == FINISHED:
            self._unlink(n)
            self.state[n] = RUNNING
            self.pos[n] = <int32_t> position
            self.running[self.n_running] = n
            self.n_running += 1

    cdef int64_t store(self, const int32_t* h, const int64_t* positions, int64_t m,
                       int32_t* stored) except -1:
        """vLLM's prepare_store of blocks ``h`` (at ``positions``): those held are reuses, the
        rest are stored if room can be made for all of them (victims: the finished list from
        its oldest, then this request's other blocks, tail first), else none is. Returns how
        many were stored, into ``stored``."""
        cdef int64_t i, need, found = 0, new = 0, kept
        cdef int32_t n
        for i in range(m):
            n = h[i]
            if self.state[n] != OUT:
                self.touch(n, positions[i])
                self.guard[n] = 1
            else:
                new += 1
        need = new - (self.capacity - self.size)
        if need > 0:
            found = self._victims(need)
        for i in range(m):
            self.guard[h[i]] = 0
        if need > 0 and found < need:  # no room for all: vLLM stores none of them
            for i in range(found):
                if self.state[self.scratch[i]] == CHOSEN:
                    self.state[self.scratch[i]] = RUNNING
            return 0
        for i in range(found):
            self._drop(self.scratch[i])
        if need > 0:  # this request's dropped blocks leave its list
            kept = 0
            for i in range(self.n_running):
                if self.state[self.running[i]] == RUNNING:
                    self.running[kept] = self.running[i]
                    kept += 1
            self.n_running = kept
        new = 0
        for i in range(m):
            n = h[i]
            if self.state[n] == OUT:
                self.state[n] = RUNNING
                self.pos[n] = <int32_t> positions[i]
                self.running[self.n_running] = n
                self.n_running += 1
                self.size += 1
                self.ids.retain(n)
                stored[new] = n
                new += 1
        return new

    cdef int64_t _victims(self, int64_t need) noexcept nogil:
        """Up to ``need`` victims into ``scratch``; how many were found."""
        cdef int64_t found = 0, i
        cdef int32_t n = self.head, best, j
        while n >= 0 and found < need:
            self.scratch[found] = n
            found += 1
            n = self.nxt[n]
        while found < need:  # this request's own blocks, tail first, never the store's
            best = -1
            for i in range(self.n_running):
                j = self.running[i]
                if self.state[j] == RUNNING and not self.guard[j] and (best < 0 or self.pos[j] > self.pos[best]):
                    best = j
            if best < 0:
                break
            self.state[best] = CHOSEN
            self.scratch[found] = best
            found += 1
        return found

    cdef void _drop(self, int32_t n) noexcept nogil:
        if self.state[n] == FINISHED:
            self._unlink(n)
        self.state[n] = OUT
        self.size -= 1
        self.ids.release(n)

    cdef void finish(self, int32_t* slots, Py_ssize_t first, Py_ssize_t cacheable) noexcept nogil:
        """The request's blocks join the finished list tail first (block 0 the newest);
        ``slots`` is scratch of ``cacheable``; every position is in ``[first, cacheable)``."""
        cdef Py_ssize_t i
        cdef int32_t n
        for i in range(first, cacheable):
            slots[i] = -1
        for i in range(self.n_running):
            n = self.running[i]
            slots[self.pos[n]] = n
        for i in range(cacheable - 1, first - 1, -1):
            n = slots[i]
            if n >= 0 and self.state[n] == RUNNING:
                self.state[n] = FINISHED
                self._append(n)
        self.n_running = 0

    cdef int64_t serve(self, const int32_t* h, Py_ssize_t g, Py_ssize_t cacheable,
                       int64_t prompt, int64_t bt, int8_t* marks, int64_t* positions,
                       int32_t* keys, int32_t* stored, int32_t* slots) except -1:
        """One request (its block ids ``h``) past its ``g`` GPU hits; returns the prompt
        tokens the CPU and file tiers serve. The pointers are scratch of ``cacheable``."""
        cdef Py_ssize_t nf = g, i, m = 0
        cdef int64_t served = 0, count
        cdef FileTierFifo files = self.files
        self.reserve(cacheable)
        while nf < cacheable:  # the lookup: 0 a CPU hit, 1 a file hit
            if self.state[h[nf]] != OUT:
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
                self.store(&h[i], positions, 1, stored)
            marks[i - g] = 2 if self.state[h[i]] != OUT else 3
        for i in range(g, nf):  # loads are touched after the staging (it may evict them)
            if marks[i - g] == 2:
                self.touch(h[i], i)
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
            count = self.store(keys, positions, m, stored)
            if files is not None:
                for i in range(count):
                    files.offer(stored[i])
        self.finish(slots, 0 if nf == g else g, cacheable)
        return served
