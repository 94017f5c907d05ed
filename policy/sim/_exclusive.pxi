# The exclusive flow: one copy per block; promotions move up to the GPU, a GPU victim moves
# down to CPU (if admitted), a CPU victim to the cold tier, a cold victim leaves the stack.
# With ``tail_first`` (TensorRT-LLM, which evicts only leaves of its radix tree) a request's
# GPU blocks are touched tail to head after it is served. With ``gpu_filter`` (a
# :class:`SightingFilter`) a block the request computed afresh stays in the GPU tier only if it
# passes the filter: as an engine that caches a new block in its prefix cache only on the
# N-th request that references it, the block's slot held while the request ran, then freed
# first. Its victims were evicted all the same; a refused block leaves the stack.


cdef class PriorityRule:
    cdef readonly int64_t default_priority, prefix_blocks, prefix_priority

    def __cinit__(self, int64_t default_priority=35, int64_t prefix_blocks=0,
                  int64_t prefix_priority=35):
        self.default_priority = default_priority
        self.prefix_blocks = prefix_blocks
        self.prefix_priority = prefix_priority


cdef class ExclusiveFlow(Flow):
    cdef readonly Tier gpu, cpu, cold
    cdef readonly Admitter admitter
    cdef readonly SightingFilter gpu_filter
    cdef readonly OfferObserver offers
    cdef bint keep_info, needs_info, tail_first
    cdef PriorityRule rule
    cdef int64_t* i_prio
    cdef int64_t* i_next
    cdef int64_t* i_pos
    cdef Buf gpu_victims, cpu_victims, cold_victims, fresh

    def __cinit__(self, Tier gpu, Tier cpu=None, Tier cold=None, Admitter admitter=None, *,
                  PriorityRule rule=None, bint tail_first=False, bint track_parents=False,
                  OfferObserver offers=None, Interner interner=None,
                  SightingFilter gpu_filter=None):
        if interner is not None:
            self.interner = interner
        self.gpu = gpu
        self.cpu = cpu
        self.cold = cold
        self.admitter = admitter
        self.rule = rule if rule is not None else PriorityRule()
        self.tail_first = tail_first
        reads = gpu.reads_info or (cpu is not None and cpu.reads_info) or (
            cold is not None and cold.reads_info) or (admitter is not None and admitter.reads_info)
        # a block's latest info travels with it when it moves down, for tiers that read it
        self.keep_info = reads
        self.needs_info = reads
        self.track_parents = track_parents
        self.offers = offers
        if offers is not None:
            self.observers.append(offers)
        if admitter is not None and admitter.observer is not None:
            self.observers.append(admitter.observer)
        self.gpu_filter = gpu_filter
        if gpu_filter is not None:
            self.observers.append(gpu_filter.observer)
        self.i_prio = self.i_next = self.i_pos = NULL
        memset(&self.gpu_victims, 0, sizeof(Buf))
        memset(&self.cpu_victims, 0, sizeof(Buf))
        memset(&self.cold_victims, 0, sizeof(Buf))
        memset(&self.fresh, 0, sizeof(Buf))

    def __dealloc__(self):
        free(self.i_prio)
        free(self.i_next)
        free(self.i_pos)
        buf_free(&self.gpu_victims)
        buf_free(&self.cpu_victims)
        buf_free(&self.cold_victims)
        buf_free(&self.fresh)

    cdef int _reserve(self, Py_ssize_t old, Py_ssize_t new) except -1:
        self.gpu.reserve(new)
        if self.cpu is not None:
            self.cpu.reserve(new)
        if self.cold is not None:
            self.cold.reserve(new)
        if self.admitter is not None:
            self.admitter.reserve(new)
        if self.gpu_filter is not None:
            self.gpu_filter.reserve(new)
        if self.keep_info:
            self.i_prio = grow_i64(self.i_prio, old, new, 35)
            self.i_next = grow_i64(self.i_next, old, new, NEVER)
            self.i_pos = grow_i64(self.i_pos, old, new, 0)
        return 0

    def uses_future(self) -> bool:
        return any(t is not None and t.uses_future for t in (self.gpu, self.cpu, self.cold))

    cdef bint in_tier(self, int tier, id_t k):
        cdef Tier t = self.gpu if tier == GPU else self.cpu if tier == CPU else self.cold
        return t is not None and t.inside[k]

    cdef bint held_above_cold(self, id_t k):
        return self.gpu.inside[k] or (self.cpu is not None and self.cpu.inside[k])

    cdef Py_ssize_t lookup(self, const id_t* hs, Py_ssize_t nb, int64_t prompt, int64_t bt) except -1:
        cdef Py_ssize_t nf = 0
        cdef id_t h
        cdef int8_t* gpu = self.gpu.inside
        cdef int8_t* cpu = self.cpu.inside if self.cpu is not None else NULL
        cdef int8_t* cold = self.cold.inside if self.cold is not None else NULL
        while nf < nb:
            h = hs[nf]
            if gpu[h]:
                self.found[nf] = GPU
            elif cpu != NULL and cpu[h]:
                self.found[nf] = CPU
            elif cold != NULL and cold[h]:
                self.found[nf] = COLD
            else:
                break
            nf += 1
        return nf

    cdef inline void info_at(self, Py_ssize_t i, const int64_t* next_uses, Info* info):
        if not self.needs_info and next_uses == NULL:
            info.priority = 35
            info.next_use = NEVER
            info.position = 0
            return
        info.priority = (self.rule.prefix_priority if i < self.rule.prefix_blocks
                         else self.rule.default_priority)
        info.next_use = next_uses[i] if next_uses != NULL else NEVER
        info.position = i

    cdef int drop(self, id_t h) except -1:
        if self.keep_info:
            self.i_prio[h] = 35
            self.i_next[h] = NEVER
            self.i_pos[h] = 0
        self.t.drops_total += 1
        self.log(K_DROP, h, OFF, OFF)
        return 0

    cdef int demote(self, id_t h, int tier) except -1:
        """Store ``h`` in ``tier``, cascading its victims downward (a CPU victim to the cold
        tier, a cold victim off the stack)."""
        cdef Tier cache = self.cpu if tier == CPU else self.cold if tier == COLD else None
        cdef Info info
        cdef Buf* victims = &self.cpu_victims if tier == CPU else &self.cold_victims
        cdef Py_ssize_t i
        if cache is None:
            return self.drop(h)
        if self.keep_info:
            info.priority = self.i_prio[h]
            info.next_use = self.i_next[h]
            info.position = self.i_pos[h]
        else:
            info.priority = 35
            info.next_use = NEVER
            info.position = 0
        if tier == CPU and self.admitter is not None and not cache.inside[h]:
            if not self.admitter.admit(self, h, &info):
                return self.drop(h)
        victims.n = 0
        if tier == CPU and self.offers is not None and not cache.inside[h]:
            self.offers.offer(self, h)
        cache.insert(h, &info, victims)
        if tier == CPU and self.offers is not None:
            for i in range(victims.n):
                self.offers.forget(victims.data[i])
            if not cache.inside[h]:
                self.offers.forget(h)
        if not cache.inside[h]:
            return self.drop(h)
        if tier == CPU:
            self.t.cpu_stores_total += 1
            self.t.cpu_evictions_total += victims.n
        else:
            self.t.cold_stores_total += 1
            self.t.cold_evictions_total += victims.n
        if self.logging:
            self.log(K_STORE, h, GPU if tier == CPU else CPU, tier)
        for i in range(victims.n):  # the buffer of the next tier down is a different one
            self.log(K_EVICT, victims.data[i], tier, OFF)
            self.demote(victims.data[i], COLD if tier == CPU else OFF)
        return 0

    cdef int into_gpu(self, id_t h, Info* info) except -1:
        cdef Py_ssize_t i
        cdef Buf victims
        self.gpu_victims.n = 0
        self.gpu.insert(h, info, &self.gpu_victims)
        if not self.gpu_victims.n:
            return 0
        victims = self.gpu_victims            # demote never inserts into the GPU tier
        self.t.gpu_evictions_total += victims.n
        for i in range(victims.n):
            self.log(K_EVICT, victims.data[i], GPU, OFF)
            self.demote(victims.data[i], CPU)
        return 0

    cdef int serve(self, const id_t* hs, Py_ssize_t nb, Py_ssize_t nf, int64_t prompt,
                   int64_t bt, const int64_t* next_uses) except -1:
        cdef Py_ssize_t i
        cdef id_t h
        cdef Tier gpu = self.gpu
        cdef Info info
        self.fresh.n = 0
        for i in range(nf):  # pin the GPU hits, as an engine does before it allocates
            if self.found[i] == GPU:
                self.info_at(i, next_uses, &info)
                gpu.touch(hs[i], &info)
        for i in range(nb):
            h = hs[i]
            self.info_at(i, next_uses, &info)
            if self.keep_info:
                self.i_prio[h] = info.priority
                self.i_next[h] = info.next_use
                self.i_pos[h] = info.position
            if gpu.inside[h]:
                if i >= nf:  # resident past the prefix gap: recomputed, still a use
                    gpu.touch(h, &info)
                continue
            if self.cpu is not None and self.cpu.inside[h]:
                self.cpu.remove(h)
                if self.offers is not None:
                    self.offers.promoted(h, i < nf and self.found[i] == CPU)
            elif self.cold is not None and self.cold.inside[h]:
                self.cold.remove(h)
            elif self.gpu_filter is not None:
                buf_push(&self.fresh, h)
            self.into_gpu(h, &info)
        if self.tail_first:
            for i in range(nb - 1, -1, -1):
                if gpu.inside[hs[i]]:
                    self.info_at(i, next_uses, &info)
                    gpu.touch(hs[i], &info)
        for i in range(self.fresh.n):  # computed afresh: cached only if it passes the filter
            h = self.fresh.data[i]
            if gpu.inside[h] and not self.gpu_filter.tracker.passes(h):
                gpu.remove(h)
                self.drop(h)
        return 0
