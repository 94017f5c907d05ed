# A CPU tier that carries its own baseline (policy/learn/shadowed.py documents the rule; the
# per-key version under tests/ is the oracle): candidate orders each run as a ghost at the
# tier's capacity and as an order over the blocks the tier holds; the real tier evicts in the
# order of the candidate whose ghost serves the most (decayed), with hysteresis. A candidate
# may carry an admitter: its ghost is offered only what it admits, and the real tier stores
# only what the admitter of the candidate it follows admits.

DEF MAX_CANDIDATES = 8


cdef class ShadowWatch(Observer):
    """Scores every ghost and the real tier on each request before it is served."""
    cdef Shadow shadow

    def __cinit__(self, Shadow shadow):
        self.shadow = shadow

    cdef int reserve(self, Py_ssize_t n) except -1:
        if self.shadow.signals is not None:
            self.shadow.signals.reserve(n)
        return 0

    cdef int before(self, Flow flow, const id_t* hs, Py_ssize_t nb, int64_t prompt,
                    int64_t bt) except -1:
        if self.shadow.signals is not None:
            self.shadow.signals.before(flow, hs, nb, prompt, bt)
        return self.shadow.observe(flow, hs, nb, prompt, bt)


cdef class Shadow(Tier):
    """``ghosts[i]`` and ``orders[i]``: candidate i at the tier's capacity and unbounded (the
    first is the baseline and the starting order); ``block_tokens`` per request (what the
    scores count a block as; None: the flow's); ``signals``: request signals the candidates
    share, if any."""
    cdef list ghosts, orders, admitters
    cdef Flow flow                   # the flow it serves (bind), for admitters that read it
    cdef int n
    cdef readonly RequestSignals signals
    cdef const int64_t[::1] block_tokens
    cdef bint own_block_tokens
    cdef int8_t* gpu                 # blocks known to be on the GPU: every request's, until offered
    cdef readonly int mode
    cdef double keep, margin, tokens, real_score
    cdef int64_t window, seen
    cdef double scores[MAX_CANDIDATES]
    cdef int64_t by_mode[MAX_CANDIDATES]
    cdef int64_t ghost_tokens[MAX_CANDIDATES]
    cdef readonly int64_t switches, real_tokens
    cdef double worst
    cdef bint has_worst
    cdef Buf scratch

    def __cinit__(self, capacity, ghosts, orders, block_tokens, RequestSignals signals=None,
                  int64_t window_requests=500, double margin=0.002, admitters=None):
        cdef int i
        self.set_capacity(capacity)
        if capacity is None:
            raise ValueError("a shadowed tier needs a capacity")
        if not 2 <= len(ghosts) <= MAX_CANDIDATES or len(orders) != len(ghosts):
            raise ValueError(f"need 2 to {MAX_CANDIDATES} candidates, each as a ghost and an "
                             f"order; got {len(ghosts)} and {len(orders)}")
        if window_requests < 1 or not 0 <= margin < 1:
            raise ValueError(f"window_requests must be >= 1 and margin in [0, 1), got "
                             f"{window_requests!r} and {margin!r}")
        if not all(isinstance(t, Tier) for t in (*ghosts, *orders)):
            raise ValueError("candidates must be compiled tiers")
        admitters = [None] * len(ghosts) if admitters is None else list(admitters)
        if len(admitters) != len(ghosts) or not all(
                a is None or isinstance(a, Admitter) for a in admitters):
            raise ValueError("admitters: one compiled admitter (or None) per candidate")
        self.ghosts, self.orders, self.admitters = list(ghosts), list(orders), admitters
        self.flow = None
        self.n = len(ghosts)
        for i in range(self.n):
            self.scores[i] = 0.0
            self.by_mode[i] = self.ghost_tokens[i] = 0
        self.own_block_tokens = block_tokens is not None
        if self.own_block_tokens:
            self.block_tokens = np.ascontiguousarray(block_tokens, dtype=np.int64)
        self.signals = signals
        self.gpu = NULL
        self.mode = 0
        self.keep = 1.0 - 1.0 / window_requests
        self.window = window_requests
        self.margin = margin
        self.tokens = self.real_score = 0.0
        self.seen = self.switches = self.real_tokens = 0
        self.has_worst = False
        memset(&self.scratch, 0, sizeof(Buf))

    def __dealloc__(self):
        free(self.gpu)
        buf_free(&self.scratch)

    def bind(self, Flow flow):
        """Join ``flow``: the scores (and the shared signals) see each request first, and so
        does every candidate's admitter that counts requests."""
        self.flow = flow
        flow.observe(ShadowWatch(self))
        seen = []
        for admitter in self.admitters:  # one shared by several candidates counts once
            if admitter is not None and (<Admitter> admitter).observer is not None \
                    and not any(a is admitter for a in seen):
                seen.append(admitter)
                flow.observe((<Admitter> admitter).observer)

    cdef bint admits(self, int candidate, id_t k, Info* info) except -1:
        admitter = self.admitters[candidate]
        return admitter is None or (<Admitter> admitter).admit(self.flow, k, info)

    cdef int _reserve(self, Py_ssize_t old, Py_ssize_t new) except -1:
        cdef int i
        self.gpu = grow_i8(self.gpu, old, new, 0)
        for i in range(self.n):
            (<Tier> self.ghosts[i]).reserve(new)
            (<Tier> self.orders[i]).reserve(new)
            if self.admitters[i] is not None:
                (<Admitter> self.admitters[i]).reserve(new)
        return 0

    cdef int64_t served(self, int8_t* tier, const id_t* hs, Py_ssize_t nb, int64_t prompt,
                        int64_t bt):
        """Tokens ``tier`` would serve past the GPU's prefix (prefix-contiguous lookup)."""
        cdef int64_t total = 0, tok
        cdef Py_ssize_t i
        for i in range(nb):
            if self.gpu[hs[i]]:
                continue
            if not tier[hs[i]]:
                break
            tok = prompt - i * bt
            total += bt if tok > bt else (tok if tok > 0 else 0)
        return total

    cdef int observe(self, Flow flow, const id_t* hs, Py_ssize_t nb, int64_t prompt,
                     int64_t bt) except -1:
        cdef int k, best
        cdef int64_t got
        cdef Py_ssize_t i
        cdef int64_t r = flow.request_index
        cdef double lead
        cdef Tier ghost
        if self.own_block_tokens:
            if not 0 <= r < self.block_tokens.shape[0]:
                raise ValueError(f"request {r} has no block size (the shadow knows "
                                 f"{self.block_tokens.shape[0]} requests)")
            bt = self.block_tokens[r]
        self.tokens = self.tokens * self.keep + prompt
        for k in range(self.n):
            got = self.served((<Tier> self.ghosts[k]).inside, hs, nb, prompt, bt)
            self.scores[k] = self.scores[k] * self.keep + got
            self.ghost_tokens[k] += got
        got = self.served(self.inside, hs, nb, prompt, bt)
        self.real_score = self.real_score * self.keep + got
        self.real_tokens += got
        for k in range(self.n):  # every block of the request lands on the GPU: out of every ghost
            ghost = self.ghosts[k]
            for i in range(nb):
                if ghost.inside[hs[i]]:
                    ghost.remove(hs[i])
        for i in range(nb):
            self.gpu[hs[i]] = 1
        self.seen += 1
        best = 0
        for k in range(1, self.n):
            if self.scores[k] > self.scores[best]:
                best = k
        if best != self.mode and (self.scores[best] - self.scores[self.mode]
                                  > self.margin * self.tokens):
            self.mode = best
            self.switches += 1
        self.by_mode[self.mode] += 1
        if self.seen > self.window and self.tokens > 0:
            lead = (self.real_score - self.scores[0]) / self.tokens
            if not self.has_worst or lead < self.worst:
                self.worst, self.has_worst = lead, True
        return 0

    cdef id_t pop_victim(self) except -2:
        cdef id_t victim
        cdef int k
        cdef Tier order
        self.scratch.n = 0
        (<Tier> self.orders[self.mode]).evict(1, NULL, &self.scratch)
        if self.scratch.n != 1:
            raise KeyError("pop_victim from an empty order")
        victim = self.scratch.data[0]
        for k in range(self.n):
            order = self.orders[k]
            if k != self.mode and order.inside[victim]:
                order.remove(victim)
        self.inside[victim] = 0
        self.size -= 1
        return victim

    # ---- the protocol

    cdef int touch(self, id_t k, Info* info) except -1:
        if not self.inside[k]:
            raise KeyError(k)
        return 0

    cdef int insert(self, id_t k, Info* info, Buf* victims) except -1:
        cdef int i
        cdef Tier t
        self.gpu[k] = 0  # a GPU victim
        for i in range(self.n):
            t = self.ghosts[i]
            if not t.inside[k] and self.admits(i, k, info):
                self.scratch.n = 0
                t.insert(k, info, &self.scratch)
        if self.inside[k] or not self.admits(self.mode, k, info):
            return 0  # refused by the admitter of the candidate followed: the flow drops it
        for i in range(self.n):
            t = self.orders[i]
            self.scratch.n = 0
            t.insert(k, info, &self.scratch)
        self.inside[k] = 1
        self.size += 1
        while self.size > self.capacity:
            buf_push(victims, self.pop_victim())
        return 0

    cdef int remove(self, id_t k) except -1:
        cdef int i
        cdef Tier t
        self.inside[k] = 0
        self.size -= 1
        for i in range(self.n):
            t = self.orders[i]
            if t.inside[k]:
                t.remove(k)
        return 0

    cdef int evict(self, Py_ssize_t n, int8_t* protected, Buf* out) except -1:
        cdef Py_ssize_t i
        if protected != NULL:
            for i in range(self.n_ids):
                if protected[i]:
                    raise ValueError("learned-safe evicts in its own order; no protected "
                                     "blocks")
        if n > self.size:
            return 0
        for i in range(n):
            buf_push(out, self.pop_victim())
        return 1

    def stats(self):
        """(requests served in each candidate's order, switches, the lowest decayed lead of
        the real tier over the baseline ghost as a share of the window's tokens (None before
        a window has passed), tokens each ghost served, tokens the real tier served)."""
        cdef int k
        return ([self.by_mode[k] for k in range(self.n)], self.switches,
                self.worst if self.has_worst else None,
                [self.ghost_tokens[k] for k in range(self.n)], self.real_tokens)
