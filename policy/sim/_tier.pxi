# The one tier protocol, compiled: a tier holds blocks (dense ids) and an eviction order.
#
#   touch(k, info)              a use of a resident block
#   insert(k, info, victims)    store k, evicting as needed (victims appended, oldest first)
#   evict(n, protected, out)    atomic: n victims outside ``protected`` or none (False)
#   remove(k)                   forget a resident block (promoted or dropped elsewhere)
#   begin() / finish()          a request's scope: request-scoped tiers (vLLM's CPU cores)
#                               apply recency once per request at finish
#   on_miss(keys)               blocks a store looked for and did not find (ghost hits)
#
# Per-access policies implement the CachePolicy hooks (c_store, c_hit, c_evict, c_forget,
# c_before_insert) and get the accounting here; request-scoped ones override the protocol.

# (Declared in _core.pxd, so other extensions cimport it.)

cdef class Tier:
    def __cinit__(self, *args, **kwargs):
        self.inside = NULL
        self.n_ids = 0
        self.size = 0
        self.capacity = -1
        self.reads_info = False
        self.uses_future = False
        self.request_scoped = False

    def __dealloc__(self):
        free(self.inside)

    cdef int set_capacity(self, capacity) except -1:
        if capacity is not None and (isinstance(capacity, bool) or not isinstance(capacity, int)
                                     or capacity < 0):
            raise ValueError(f"capacity_blocks must be an int >= 0 or None (unlimited), "
                             f"got {capacity!r}")
        self.capacity = -1 if capacity is None else capacity
        return 0

    cdef int reserve(self, Py_ssize_t n) except -1:
        cdef Py_ssize_t new
        if n <= self.n_ids:
            return 0
        new = grown(self.n_ids, n)
        self.inside = grow_i8(self.inside, self.n_ids, new, 0)
        self._reserve(self.n_ids, new)
        self.n_ids = new
        return 0

    cdef int _reserve(self, Py_ssize_t old, Py_ssize_t new) except -1:
        return 0

    # ---- per-access hooks
    cdef void c_before_insert(self, id_t k, Info* info):
        pass

    cdef void c_store(self, id_t k, Info* info):
        pass

    cdef void c_hit(self, id_t k, Info* info):
        pass

    cdef id_t c_evict(self):
        return NONE

    cdef void c_forget(self, id_t k):
        pass

    # ---- the protocol
    cdef int begin(self) except -1:
        pass

    cdef int finish(self) except -1:
        pass

    cdef int on_miss(self, Buf* keys) except -1:
        pass

    cdef int touch(self, id_t k, Info* info) except -1:
        self.c_hit(k, info)
        return 0

    cdef int insert(self, id_t k, Info* info, Buf* victims) except -1:
        cdef id_t v
        if self.inside[k]:
            self.c_hit(k, info)
            return 0
        if self.capacity == 0:
            return 0
        self.c_before_insert(k, info)
        if self.capacity >= 0:
            while self.size >= self.capacity and self.size:
                v = self.c_evict()
                self.inside[v] = 0
                self.size -= 1
                buf_push(victims, v)
        self.inside[k] = 1
        self.size += 1
        self.c_store(k, info)
        return 0

    cdef int remove(self, id_t k) except -1:
        self.inside[k] = 0
        self.size -= 1
        self.c_forget(k)
        return 0

    cdef int evict(self, Py_ssize_t n, int8_t* protected, Buf* out) except -1:
        """Per-access policies evict in their own order and cannot skip blocks: ``protected``
        must be NULL. Returns 1, or 0 (nothing evicted) when fewer than n are resident."""
        cdef Py_ssize_t i
        cdef id_t v
        if protected != NULL:
            raise ValueError("this policy cannot evict around protected blocks")
        if n > self.size:
            return 0
        for i in range(n):
            v = self.c_evict()
            self.inside[v] = 0
            self.size -= 1
            buf_push(out, v)
        return 1

    # ---- Python access (per-key adapters and tests): ids are ints >= 0
    def py_reserve(self, Py_ssize_t n):
        self.reserve(n)

    def py_contains(self, id_t k) -> bool:
        return k < self.n_ids and self.inside[k] != 0

    def py_touch(self, id_t k, int64_t priority=35, int64_t next_use=NEVER,
                 int64_t position=0):
        cdef Info info
        if not (k < self.n_ids and self.inside[k]):
            raise KeyError(k)
        info.priority, info.next_use, info.position = priority, next_use, position
        self.touch(k, &info)

    def py_insert(self, id_t k, int64_t priority=35, int64_t next_use=NEVER,
                  int64_t position=0):
        cdef Info info
        cdef Buf victims
        memset(&victims, 0, sizeof(Buf))
        self.reserve(k + 1)
        info.priority, info.next_use, info.position = priority, next_use, position
        try:
            self.insert(k, &info, &victims)
            return [victims.data[i] for i in range(victims.n)]
        finally:
            buf_free(&victims)

    def py_remove(self, id_t k):
        if not (k < self.n_ids and self.inside[k]):
            raise KeyError(k)
        self.remove(k)

    def py_evict(self, Py_ssize_t n, protected=()):
        """``n`` victims (list of ids) outside ``protected``, or None when there are not
        enough; nothing changes then."""
        cdef Buf out
        cdef int8_t* mask = NULL
        cdef Py_ssize_t i
        memset(&out, 0, sizeof(Buf))
        protected = [k for k in protected if 0 <= k < self.n_ids]
        try:
            if protected:
                mask = <int8_t*> calloc(self.n_ids, 1)
                for k in protected:
                    mask[<id_t> k] = 1
            if not self.evict(n, mask, &out):
                return None
            return [out.data[i] for i in range(out.n)]
        finally:
            free(mask)
            buf_free(&out)

    def py_begin(self):
        self.begin()

    def py_on_miss(self, ids):
        cdef Buf keys
        memset(&keys, 0, sizeof(Buf))
        try:
            for k in ids:
                self.reserve(k + 1)
                buf_push(&keys, k)
            self.on_miss(&keys)
        finally:
            buf_free(&keys)

    def py_finish(self):
        self.finish()

    def py_members(self):
        return [i for i in range(self.n_ids) if self.inside[i]]


cdef class PyTier(Tier):
    """A tier implemented in Python (the per-key protocol of ``kvtier.policy.sim.policies``:
    ``__contains__``, ``touch``, ``insert -> victims``, ``remove``, ``evict``, ``begin``,
    ``finish``), driven by a compiled flow. Keys are block hashes; slow, for policies that
    have no compiled form."""
    cdef readonly object target
    cdef object info_type
    cdef Interner interner
    cdef bint has_evict, has_scope

    def __cinit__(self, target, info_type, Interner interner):
        self.target = target
        self.info_type = info_type
        self.interner = interner
        capacity = getattr(target, "capacity_blocks", None)
        self.capacity = -1 if capacity is None else capacity
        self.reads_info = bool(getattr(target, "reads_info", True))
        self.uses_future = bool(getattr(target, "uses_future", False))
        self.request_scoped = bool(getattr(target, "request_scoped", False))
        self.has_evict = hasattr(target, "evict")
        self.has_scope = hasattr(target, "finish")

    cdef object _info(self, Info* info):
        next_use = float("inf") if info.next_use == NEVER else info.next_use
        return self.info_type(info.priority, next_use, info.position)

    cdef int _sync(self, object keys) except -1:
        """Mark ``keys`` (hashes) as no longer resident."""
        cdef id_t v
        for key in keys:
            v = self.interner.find(key)
            if v != NONE and self.inside[v]:
                self.inside[v] = 0
                self.size -= 1
        return 0

    cdef int _ids(self, object keys, Buf* out) except -1:
        for key in keys:
            buf_push(out, self.interner.find(key))
        return 0

    cdef int touch(self, id_t k, Info* info) except -1:
        # vLLM's flow touches a request's loads after staging its cold hits, which may have
        # evicted some of them; the compiled request-scoped tiers ignore those, and so does this
        if self.inside[k]:
            self.target.touch(self.interner.by_id[k], self._info(info))
        return 0

    cdef int insert(self, id_t k, Info* info, Buf* victims) except -1:
        cdef uint64_t h = self.interner.by_id[k]
        evicted = self.target.insert(h, self._info(info))
        self._sync(evicted)
        if victims != NULL:
            self._ids(evicted, victims)
        if h in self.target and not self.inside[k]:
            self.inside[k] = 1
            self.size += 1
        return 0

    cdef int remove(self, id_t k) except -1:
        self.target.remove(self.interner.by_id[k])
        self.inside[k] = 0
        self.size -= 1
        return 0

    cdef int evict(self, Py_ssize_t n, int8_t* protected, Buf* out) except -1:
        cdef Py_ssize_t i
        keep = () if protected == NULL else [self.interner.by_id[i] for i in range(self.n_ids)
                                              if protected[i]]
        evicted = self.target.evict(n, keep)
        if evicted is None:
            return 0
        self._sync(evicted)
        self._ids(evicted, out)
        return 1

    cdef int begin(self) except -1:
        if self.has_scope:
            self.target.begin()

    cdef int finish(self) except -1:
        if self.has_scope:
            self.target.finish()
