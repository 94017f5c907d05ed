# vLLM 0.33's OffloadingConnector. The GPU tier is vLLM's block pool: between requests every
# cached block sits in the free queue (least recently released at the head); a request's hits
# are taken out of it, each other full block is computed into a block taken from the head
# (which loses the hash it cached), and the finished request's blocks go back to the tail in
# reverse. The GPU serves at most (prompt_tokens - 1) // block_tokens blocks; a partial last
# block is never cached. Every computed block is offered to the CPU tier (write-through,
# gated by the admitter and store_threshold), and so are the GPU's hits of a request that
# loads nothing from a lower tier (vLLM's scheduler offers its prompt from the first block:
# a reuse where the CPU tier holds one, else a store candidate); each CPU store cascades to the cold (file) tier,
# which skips blocks it holds; a cold hit is staged through CPU before loading to the GPU.
# With a GPU sighting filter (``GpuPool.filter``, kvtier's vLLM plug-in's prefix-cache filter)
# a block written for the request gets its hash only if it passes the filter; one that does
# not holds its slot while the request runs and is then freed to the head of the queue, as
# vLLM frees every block without a hash (reused first, caching nothing).


cdef class GpuPool:
    """Physical blocks, the hash each caches, each hash's copies (oldest first), the queue."""
    cdef readonly int64_t capacity
    cdef id_t* copy_head         # per hash id: its oldest block, NONE if not cached
    cdef id_t* copy_tail
    cdef id_t* block_hash        # per physical block
    cdef id_t* copy_prev
    cdef id_t* copy_next
    cdef id_t* q_prev
    cdef id_t* q_next
    cdef id_t q_head, q_tail
    cdef Py_ssize_t n_ids, blocks, block_cap
    cdef readonly Py_ssize_t cached     # distinct hashes cached
    cdef Buf held
    cdef Buf unhashed
    cdef StoreThreshold filter          # None: every written block gets its hash

    def __cinit__(self, capacity):
        if capacity is not None and (isinstance(capacity, bool) or not isinstance(capacity, int)
                                     or capacity < 0):
            raise ValueError(f"capacity_blocks must be an int >= 0 or None (unlimited), "
                             f"got {capacity!r}")
        self.capacity = -1 if capacity is None else capacity
        self.copy_head = self.copy_tail = NULL
        self.block_hash = self.copy_prev = self.copy_next = self.q_prev = self.q_next = NULL
        self.q_head = self.q_tail = NONE
        self.n_ids = self.blocks = self.block_cap = self.cached = 0
        memset(&self.held, 0, sizeof(Buf))
        memset(&self.unhashed, 0, sizeof(Buf))
        self.filter = None

    def __dealloc__(self):
        free(self.copy_head)
        free(self.copy_tail)
        free(self.block_hash)
        free(self.copy_prev)
        free(self.copy_next)
        free(self.q_prev)
        free(self.q_next)
        buf_free(&self.held)
        buf_free(&self.unhashed)

    cdef int reserve(self, Py_ssize_t n) except -1:
        cdef Py_ssize_t new
        if n <= self.n_ids:
            return 0
        new = grown(self.n_ids, n)
        self.copy_head = grow_ids(self.copy_head, self.n_ids, new, NONE)
        self.copy_tail = grow_ids(self.copy_tail, self.n_ids, new, NONE)
        self.n_ids = new
        return 0

    cdef inline bint has(self, id_t h):
        return self.copy_head[h] != NONE

    cdef inline void _q_unlink(self, id_t b):
        cdef id_t p = self.q_prev[b]
        cdef id_t q = self.q_next[b]
        if p == NONE:
            self.q_head = q
        else:
            self.q_next[p] = q
        if q == NONE:
            self.q_tail = p
        else:
            self.q_prev[q] = p

    cdef inline void _q_append(self, id_t b):
        self.q_prev[b] = self.q_tail
        self.q_next[b] = NONE
        if self.q_tail == NONE:
            self.q_head = b
        else:
            self.q_next[self.q_tail] = b
        self.q_tail = b

    cdef inline void _q_prepend(self, id_t b):
        self.q_next[b] = self.q_head
        self.q_prev[b] = NONE
        if self.q_head == NONE:
            self.q_tail = b
        else:
            self.q_prev[self.q_head] = b
        self.q_head = b

    cdef id_t _allocate(self, Buf* victims) except -2:
        cdef id_t block, old, p, q
        cdef Py_ssize_t new
        if self.capacity < 0 or self.blocks < self.capacity:
            if self.blocks == self.block_cap:
                new = grown(self.block_cap, self.blocks + 1)
                self.block_hash = grow_ids(self.block_hash, self.block_cap, new, NONE)
                self.copy_prev = grow_ids(self.copy_prev, self.block_cap, new, NONE)
                self.copy_next = grow_ids(self.copy_next, self.block_cap, new, NONE)
                self.q_prev = grow_ids(self.q_prev, self.block_cap, new, NONE)
                self.q_next = grow_ids(self.q_next, self.block_cap, new, NONE)
                self.block_cap = new
            self.blocks += 1
            return <id_t> (self.blocks - 1)
        if self.q_head == NONE:
            return NONE
        block = self.q_head
        self._q_unlink(block)
        old = self.block_hash[block]
        if old == NONE:  # a block freed without a hash: nothing cached is lost
            return block
        p = self.copy_prev[block]
        q = self.copy_next[block]
        if p == NONE:
            self.copy_head[old] = q
        else:
            self.copy_next[p] = q
        if q == NONE:
            self.copy_tail[old] = p
        else:
            self.copy_prev[q] = p
        if self.copy_head[old] == NONE:
            self.cached -= 1
            buf_push(victims, old)
        return block

    cdef int serve(self, const id_t* hs, Py_ssize_t hits, Py_ssize_t cacheable,
                   Buf* victims) except -1:
        """``hs[:hits]`` are reused, ``hs[hits:cacheable]`` written into fresh blocks;
        ``victims`` receives the hashes whose last copy was evicted."""
        cdef Py_ssize_t i
        cdef id_t block, h
        self.held.n = 0
        self.unhashed.n = 0
        for i in range(hits):
            block = self.copy_head[hs[i]]
            if self.q_prev[block] == NONE and self.q_head != block:
                raise ValueError("a block hash repeats within one request: block ids must "
                                 "name whole prefixes (prefix-chained)")
            self._q_unlink(block)
            self.q_prev[block] = NONE
            self.q_next[block] = NONE
            buf_push(&self.held, block)
        for i in range(hits, cacheable):
            block = self._allocate(victims)
            if block == NONE:  # every block is held by this request: nothing more is cached
                break
            h = hs[i]
            if self.filter is not None and not self.filter.passes(h):
                self.block_hash[block] = NONE
                buf_push(&self.unhashed, block)
                continue
            self.block_hash[block] = h
            self.copy_next[block] = NONE
            self.copy_prev[block] = self.copy_tail[h]
            if self.copy_tail[h] == NONE:
                self.copy_head[h] = block
                self.cached += 1
            else:
                self.copy_next[self.copy_tail[h]] = block
            self.copy_tail[h] = block
            buf_push(&self.held, block)
        for i in range(self.held.n - 1, -1, -1):
            self._q_append(self.held.data[i])
        for i in range(self.unhashed.n):  # freed tail first: the request's last at the head
            self._q_prepend(self.unhashed.data[i])
        return 0


cdef class VllmFlow(Flow):
    cdef readonly GpuPool gpu
    cdef readonly Tier cpu
    cdef readonly Lru cold
    cdef readonly StoreThreshold threshold
    cdef readonly Admitter admitter
    cdef readonly SightingFilter gpu_filter
    cdef PriorityRule rule
    cdef int8_t* protected
    cdef int64_t* missed_at       # request index of the last store miss noted per block
    cdef Buf victims, stored, evicted, loads, computed, offer, misses, one, offered

    def __cinit__(self, GpuPool gpu, Tier cpu=None, Lru cold=None,
                  StoreThreshold threshold=None, Admitter admitter=None, *,
                  PriorityRule rule=None, bint track_parents=False, Interner interner=None,
                  SightingFilter gpu_filter=None):
        if interner is not None:
            self.interner = interner
        if cpu is not None and not cpu.request_scoped:
            raise ValueError("the vLLM flow's CPU tier must be a request-scoped core")
        self.gpu = gpu
        self.cpu = cpu
        self.cold = cold
        self.threshold = threshold if threshold is not None else StoreThreshold(0)
        self.admitter = admitter
        if admitter is not None and admitter.observer is not None:
            self.observers.append(admitter.observer)
        self.gpu_filter = gpu_filter
        if gpu_filter is not None:
            gpu.filter = gpu_filter.tracker
            self.observers.append(gpu_filter.observer)
        self.rule = rule if rule is not None else PriorityRule()
        self.track_parents = track_parents
        self.protected = NULL
        self.missed_at = NULL
        memset(&self.victims, 0, sizeof(Buf))
        memset(&self.stored, 0, sizeof(Buf))
        memset(&self.evicted, 0, sizeof(Buf))
        memset(&self.loads, 0, sizeof(Buf))
        memset(&self.computed, 0, sizeof(Buf))
        memset(&self.offer, 0, sizeof(Buf))
        memset(&self.misses, 0, sizeof(Buf))
        memset(&self.one, 0, sizeof(Buf))
        memset(&self.offered, 0, sizeof(Buf))

    def __dealloc__(self):
        free(self.protected)
        free(self.missed_at)
        buf_free(&self.victims)
        buf_free(&self.stored)
        buf_free(&self.evicted)
        buf_free(&self.loads)
        buf_free(&self.computed)
        buf_free(&self.offer)
        buf_free(&self.misses)
        buf_free(&self.one)
        buf_free(&self.offered)

    cdef int _reserve(self, Py_ssize_t old, Py_ssize_t new) except -1:
        self.gpu.reserve(new)
        if self.cpu is not None:
            self.cpu.reserve(new)
        if self.cold is not None:
            self.cold.reserve(new)
        self.threshold.reserve(new)
        if self.admitter is not None:
            self.admitter.reserve(new)
        if self.gpu_filter is not None:
            self.gpu_filter.reserve(new)
        self.protected = grow_i8(self.protected, old, new, 0)
        self.missed_at = grow_i64(self.missed_at, old, new, -1)
        return 0

    cdef bint in_tier(self, int tier, id_t k):
        if tier == GPU:
            return self.gpu.has(k)
        if tier == CPU:
            return self.cpu is not None and self.cpu.inside[k]
        return self.cold is not None and self.cold.inside[k]

    cdef bint held_above_cold(self, id_t k):
        return self.gpu.has(k) or (self.cpu is not None and self.cpu.inside[k])

    cdef Py_ssize_t lookup(self, const id_t* hs, Py_ssize_t nb, int64_t prompt, int64_t bt) except -1:
        cdef Py_ssize_t gpu_limit = max(0, min(nb, (prompt - 1) // bt))
        cdef Py_ssize_t cacheable = max(0, min(nb, prompt // bt))
        cdef Py_ssize_t nf = 0
        cdef id_t h
        while nf < gpu_limit and self.gpu.copy_head[hs[nf]] != NONE:
            self.found[nf] = GPU
            nf += 1
        while nf < cacheable:
            h = hs[nf]
            if self.cpu is not None and self.cpu.inside[h]:
                self.found[nf] = CPU
            elif self.cold is not None and self.cold.inside[h]:
                self.found[nf] = COLD
            else:
                break
            nf += 1
        return nf

    cdef int cpu_store(self, const id_t* keys, const int64_t* positions, Py_ssize_t n,
                       bint threshold) except -1:
        """vLLM's prepare_store: ``stored``/``evicted`` filled; returns 0 when room could
        not be made (nothing stored)."""
        cdef Py_ssize_t i, n_store = 0, free_slots
        cdef id_t k
        cdef Info info
        cdef Tier cpu = self.cpu
        cdef bint gated = threshold and self.threshold.threshold >= 2
        self.stored.n = 0
        self.evicted.n = 0
        self.offer.n = 0
        self.misses.n = 0
        if gated:
            self.threshold.count(keys, n)
        info.priority = 35
        info.next_use = NEVER
        for i in range(n):
            k = keys[i]
            info.position = positions[i]
            if cpu.inside[k]:
                cpu.touch(k, &info)          # an existing block: a reuse
            elif not gated or self.threshold.passes(k):
                buf_push(&self.offer, <id_t> i)
                if self.missed_at[k] != self.request_index:
                    self.missed_at[k] = self.request_index
                    buf_push(&self.misses, k)
        if self.misses.n:
            cpu.on_miss(&self.misses)
        n_store = self.offer.n
        if n_store == 0:
            return 1
        if cpu.capacity >= 0:
            free_slots = cpu.capacity - cpu.size
            if n_store > free_slots:
                for i in range(n):
                    self.protected[keys[i]] = 1
                ok = cpu.evict(n_store - free_slots, self.protected, &self.evicted)
                for i in range(n):
                    self.protected[keys[i]] = 0
                if not ok:
                    return 0
        for i in range(n_store):
            k = keys[self.offer.data[i]]
            info.position = positions[self.offer.data[i]]
            cpu.insert(k, &info, &self.evicted)
            buf_push(&self.stored, k)
        return 1

    cdef int count_writes(self, Py_ssize_t refused_key_count, const id_t* refused) except -1:
        cdef Py_ssize_t i
        self.t.cpu_stores_total += self.stored.n
        self.t.cpu_evictions_total += self.evicted.n
        self.t.drops_total += refused_key_count
        if self.logging:
            for i in range(self.evicted.n):
                self.log(K_EVICT, self.evicted.data[i], CPU, OFF)
            for i in range(self.stored.n):
                self.log(K_STORE, self.stored.data[i], GPU, CPU)
            for i in range(refused_key_count):
                self.log(K_DROP, refused[i], OFF, OFF)
        return 0

    cdef int serve(self, const id_t* hs, Py_ssize_t nb, Py_ssize_t nf, int64_t prompt,
                   int64_t bt, const int64_t* next_uses) except -1:
        cdef Py_ssize_t cacheable = max(0, min(nb, prompt // bt))
        cdef Py_ssize_t gpu_hits = 0, i
        cdef id_t h
        cdef int64_t position
        cdef Tier cpu = self.cpu
        cdef Info info
        while gpu_hits < nf and self.found[gpu_hits] == GPU:
            gpu_hits += 1
        self.loads.n = 0
        self.computed.n = 0
        info.priority = 35
        info.next_use = NEVER
        for i in range(gpu_hits, cacheable):
            h = hs[i]
            if i < nf:
                if self.found[i] == COLD and cpu is not None:
                    position = i      # a cold hit takes a CPU slot, no store threshold
                    self.cpu_store(&hs[i], &position, 1, False)
                    self.one.n = 0
                    if not self.stored.n and not cpu.inside[h]:
                        buf_push(&self.one, h)
                    self.count_writes(self.one.n, self.one.data)
                if cpu is not None and cpu.inside[h]:
                    buf_push(&self.loads, <id_t> i)
            else:
                buf_push(&self.computed, <id_t> i)
        self.victims.n = 0
        self.gpu.serve(hs, gpu_hits, cacheable, &self.victims)
        self.t.gpu_evictions_total += self.victims.n
        if self.logging:
            for i in range(self.victims.n):
                self.log(K_EVICT, self.victims.data[i], GPU, OFF)
        if cpu is not None:
            for i in range(self.loads.n):
                info.position = self.loads.data[i]
                cpu.touch(hs[self.loads.data[i]], &info)
            if nf == gpu_hits and gpu_hits:
                # no load: vLLM's scheduler offers the prompt from its first block, so the
                # GPU's hits are offered too (a reuse where the CPU tier holds them, else a
                # store candidate, counted by store_threshold either way)
                self.offered.n = 0
                for i in range(gpu_hits):
                    buf_push(&self.offered, <id_t> i)
                for i in range(self.computed.n):
                    buf_push(&self.offered, self.computed.data[i])
                self.computed.n = 0
                for i in range(self.offered.n):
                    buf_push(&self.computed, self.offered.data[i])
            if self.computed.n:
                self.store_computed(hs, next_uses)
            cpu.finish()
        return 0

    cdef int store_computed(self, const id_t* hs, const int64_t* next_uses) except -1:
        """vLLM's store job for the request: the blocks it offers (``computed``: its
        computed blocks, and its GPU hits when it loaded nothing), gated by the admitter
        (blocks the CPU tier holds are reuses, not offers to it) then by prepare_store."""
        cdef Py_ssize_t n = 0, i, refused = 0
        cdef id_t h
        cdef id_t* keys = <id_t*> malloc(self.computed.n * sizeof(id_t))
        cdef int64_t* positions = <int64_t*> malloc(self.computed.n * sizeof(int64_t))
        cdef Info info
        cdef Py_ssize_t i2
        try:
            for i in range(self.computed.n):
                h = hs[self.computed.data[i]]
                if self.admitter is not None and not self.cpu.inside[h]:
                    i2 = self.computed.data[i]
                    info.priority = (self.rule.prefix_priority if i2 < self.rule.prefix_blocks
                                     else self.rule.default_priority)
                    info.next_use = next_uses[self.computed.data[i]] if next_uses != NULL else NEVER
                    info.position = self.computed.data[i]
                    if not self.admitter.admit(self, h, &info):
                        continue
                keys[n] = h
                positions[n] = self.computed.data[i]
                n += 1
            if not self.cpu_store(keys, positions, n, True):
                self.stored.n = 0
                self.evicted.n = 0
            for i in range(self.stored.n):
                self.protected[self.stored.data[i]] = 1
            for i in range(n):
                if not self.cpu.inside[keys[i]] and not self.protected[keys[i]]:
                    keys[refused] = keys[i]
                    refused += 1
            for i in range(self.stored.n):
                self.protected[self.stored.data[i]] = 0
            self.count_writes(refused, keys)
            if self.cold is not None:
                for i in range(self.stored.n):
                    h = self.stored.data[i]
                    if not self.cold.inside[h]:  # the file tier skips files that exist
                        self.victims.n = 0
                        self.cold.insert(h, &info, &self.victims)
                        self.t.cold_stores_total += 1
                        self.t.cold_evictions_total += self.victims.n
                        self.log(K_STORE, h, CPU, COLD)
                        if self.logging:
                            for i2 in range(self.victims.n):
                                self.log(K_EVICT, self.victims.data[i2], COLD, OFF)
        finally:
            free(keys)
            free(positions)
        return 0
