# Included by wire_columns.pyx: the GPU-resident block hashes of one stream.

from libcpp.algorithm cimport sort
from libcpp.vector cimport vector


cdef extern from *:
    void __builtin_prefetch(const void* address) noexcept nogil


cdef inline uint64_t mix64(uint64_t x) noexcept nogil:
    # splitmix64's finaliser: block hashes may be small sequential ints
    x ^= x >> 30
    x *= 0xbf58476d1ce4e5b9ULL
    x ^= x >> 27
    x *= 0x94d049bb133111ebULL
    x ^= x >> 31
    return x


cdef class ResidentSet:
    """A set of uint64 hashes: open addressing, linear probing, backward-shift deletion.

    One array of keys (0 marks a free slot; the hash 0 itself is kept in a flag), so a probe
    touches one cache line. Kept at most half full.
    """

    cdef vector[uint64_t] slots
    cdef size_t mask
    cdef size_t used
    cdef bint has_zero

    def __cinit__(self):
        self.reset()

    def __len__(self):
        return self.size()

    cdef inline size_t size(self) noexcept nogil:
        return self.used + (1 if self.has_zero else 0)

    cdef void reset(self) noexcept nogil:
        self.slots.assign(1024, 0)
        self.mask = 1023
        self.used = 0
        self.has_zero = False

    cdef void grow(self) noexcept nogil:
        cdef vector[uint64_t] old = self.slots
        cdef size_t i
        self.slots.assign(old.size() * 2, 0)
        self.mask = old.size() * 2 - 1
        self.used = 0
        for i in range(old.size()):
            if old[i] != 0:
                self.add(old[i])

    cdef void add(self, uint64_t key) noexcept nogil:
        if key == 0:
            self.has_zero = True
            return
        cdef size_t i = mix64(key) & self.mask
        while self.slots[i] != 0:
            if self.slots[i] == key:
                return
            i = (i + 1) & self.mask
        self.slots[i] = key
        self.used += 1
        if self.used * 2 > self.mask:
            self.grow()

    cdef void discard(self, uint64_t key) noexcept nogil:
        if key == 0:
            self.has_zero = False
            return
        cdef size_t i = mix64(key) & self.mask, j, home
        while self.slots[i] != key:
            if self.slots[i] == 0:
                return
            i = (i + 1) & self.mask
        # pull later members of the probe run into the hole unless their home slot lies
        # cyclically in (hole, their slot]
        j = i
        while True:
            j = (j + 1) & self.mask
            if self.slots[j] == 0:
                break
            home = mix64(self.slots[j]) & self.mask
            if (i < j and i < home <= j) or (i > j and (home > i or home <= j)):
                continue
            self.slots[i] = self.slots[j]
            i = j
        self.slots[i] = 0
        self.used -= 1

    cdef inline void prefetch(self, uint64_t key) noexcept nogil:
        """Start loading ``key``'s slot (a lookup a few rows ahead hides the cache miss)."""
        __builtin_prefetch(&self.slots[mix64(key) & self.mask])

    cdef void sorted_into(self, vector[uint64_t]* out) noexcept nogil:
        cdef size_t i
        out.clear()
        if self.has_zero:
            out.push_back(0)
        for i in range(self.mask + 1):
            if self.slots[i] != 0:
                out.push_back(self.slots[i])
        sort(out.begin(), out.end())

    def __contains__(self, uint64_t key):
        if key == 0:
            return bool(self.has_zero)
        cdef size_t i = mix64(key) & self.mask
        while self.slots[i] != 0:
            if self.slots[i] == key:
                return True
            i = (i + 1) & self.mask
        return False
