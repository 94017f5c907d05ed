"""The compiled policies behind the per-key tier protocol (see ``base.py``).

Each class here is one compiled tier of ``policy/sim/_core.pyx`` plus a map from any hashable
key to the dense ids the core works on. Flows take the compiled tier out of a fresh one
(:meth:`KeyedTier.compiled`) and drive it directly; code and tests that hold blocks by key use
these classes as they would any :class:`CachePolicy`. :func:`compiled_policy` makes the face of
a core class, so a new compiled policy is its class in ``sim/_policies.pxi`` and one line of
``registry.py``.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Hashable, Iterator, Sequence

from kvtier.policy.sim.compiled import NEVER_ID, core
from kvtier.policy.sim.policies.base import DEFAULT_INFO, BlockInfo

Key = Hashable


def info_fields(info: BlockInfo) -> tuple[int, int, int]:
    """(priority, next use, position) as the core takes them (next use NEVER_ID: none)."""
    next_use = info.next_use
    return (info.priority, NEVER_ID if math.isinf(next_use) else int(next_use),
            info.position)


class KeyedTier:
    """A compiled tier addressed by key. Subclasses name the core (``_make``)."""

    name = "keyed"
    reads_info = False
    uses_future = False
    request_scoped = False

    def __init__(self, capacity_blocks: int | None) -> None:
        self._core = self._make(capacity_blocks)
        self.capacity_blocks = capacity_blocks
        self._ids: dict[Key, int] = {}
        self._keys: list[Key] = []

    @staticmethod
    def _make(capacity_blocks: int | None):
        raise NotImplementedError

    def compiled(self):
        """The compiled tier, for a flow to drive with its own ids (only while empty)."""
        if self._keys:
            raise ValueError(f"a {self.name} tier that already holds blocks cannot join a flow")
        return self._core

    def _id(self, key: Key) -> int:
        i = self._ids.get(key)
        if i is None:
            i = self._ids[key] = len(self._keys)
            self._keys.append(key)
        return i

    def _resident_id(self, key: Key) -> int:
        i = self._ids.get(key)
        if i is None or not self._core.py_contains(i):
            raise KeyError(key)
        return i

    def __contains__(self, key: Key) -> bool:
        i = self._ids.get(key)
        return i is not None and self._core.py_contains(i)

    def __len__(self) -> int:
        return self._core.size

    def __iter__(self) -> Iterator[Key]:
        keys = self._keys
        return iter([keys[i] for i in self._core.py_members()])

    def touch(self, key: Key, info: BlockInfo = DEFAULT_INFO) -> None:
        self._core.py_touch(self._resident_id(key), *info_fields(info))

    def insert(self, key: Key, info: BlockInfo = DEFAULT_INFO) -> list[Key]:
        keys = self._keys
        return [keys[v] for v in self._core.py_insert(self._id(key), *info_fields(info))]

    def remove(self, key: Key) -> None:
        self._core.py_remove(self._resident_id(key))

    def evict(self, n: int, protected: Collection[Key] = ()) -> list[Key] | None:
        ids = [self._ids[k] for k in protected if k in self._ids]
        victims = self._core.py_evict(n, ids)
        return None if victims is None else [self._keys[v] for v in victims]

    def pop_victim(self) -> Key:
        victims = self.evict(1) if len(self) else None
        if not victims:
            raise KeyError("pop_victim from an empty cache")
        return victims[0]

    def begin(self) -> None:
        self._core.py_begin()

    def finish(self) -> None:
        self._core.py_finish()

    def on_miss(self, keys: Sequence[Key]) -> None:
        self._core.py_on_miss([self._id(k) for k in keys])

    def _keyed(self, ids) -> dict:
        return dict.fromkeys(self._keys[i] for i in ids)


def compiled_policy(name: str, core_class: str, doc: str = "", *, reads_info: bool = False,
                    uses_future: bool = False, request_scoped: bool = False) -> type[KeyedTier]:
    """The :class:`KeyedTier` of a compiled tier class of the core (``core_class``, e.g.
    ``"Lru"``), named ``name`` in the registry: a new compiled policy needs only its class in
    ``sim/_policies.pxi`` and a registry line ``PolicySpec(compiled_policy(...), summary)``."""

    def make(capacity_blocks):
        return getattr(core(), core_class)(capacity_blocks)

    return type(core_class, (KeyedTier,), {  # named as the core's class
        "__doc__": doc, "__module__": __name__, "name": name, "reads_info": reads_info,
        "uses_future": uses_future, "request_scoped": request_scoped,
        "_make": staticmethod(make)})


LRU = compiled_policy("lru", "Lru", """Least recently used: the default of vLLM's prefix cache
    and CPU tier, LMCache and SGLang, and the one LRU core of the simulator (every tier's order,
    vLLM's request-scoped CPU LRU and the store-threshold offer tracker keep their order in
    it).""")


class ARC(compiled_policy("arc", "Arc")):
    """Adaptive Replacement Cache (Megiddo & Modha, FAST'03). T1 holds keys seen once, T2 keys
    seen again; ghost lists B1/B2 remember recent victims of each; a miss that hits a ghost
    shifts T1's target size ``p`` toward the list that would have kept it. As tiers remove keys
    from the outside, room is made only when the cache is full, a T1-only full cache evicts
    from T1 into B1, and ghost lists are then trimmed to the paper's bounds."""

    @property
    def p(self) -> float:
        return self._core.p


S3FIFO = compiled_policy("s3fifo", "S3fifo", """S3-FIFO (Yang et al., SOSP'23), following the
    authors' libCacheSim ``S3FIFO.c``: a small FIFO (10% of capacity) filters one-hit wonders,
    a main FIFO reinserts used keys like a 2-bit clock, a ghost FIFO (90% of capacity)
    remembers keys evicted from the small queue.""")

PriorityLRU = compiled_policy("priority", "PriorityLru", """TensorRT-LLM's prioritized LRU:
    retention priorities 0..100, every block of the lowest non-empty priority goes before any
    of a higher one, LRU inside a priority; a use re-queues the block at the priority its new
    request gives it.""", reads_info=True)

Belady = compiled_policy("belady", "Belady", """Belady's MIN: evict the block whose next use is
    farthest in the future (the offline bound; the simulator fills
    :attr:`BlockInfo.next_use`). For uniform block sizes MIN maximises block hits over any
    demand-fetching policy; under prefix-chained ids a parent's next use precedes its child's,
    so its resident set stays prefix-closed.""", reads_info=True, uses_future=True)

VllmLRU = compiled_policy("vllm-lru", "VllmLru", """vLLM 0.33's CPU LRU
    (``CPUOffloadingManager``, ``lru``), request-scoped: a request's blocks rank after every
    finished one, tail first, until ``finish`` gives them fresh ranks tail to head, so a
    request's head outlives its tail.""", request_scoped=True)


class VllmARC(compiled_policy("vllm-arc", "VllmArc", request_scoped=True)):
    """vLLM 0.33's CPU ARC (``arc``), request-scoped: stores go to T1; at ``finish`` a reused
    block moves T1 -> T2 (or to T2's MRU end), an insertion-only block to the MRU end of its
    list; a store miss in ghost list B1 (B2) raises (lowers) T1's target; eviction takes from
    T1 while ``len(T1) >= int(target)``, else from T2, each falling back to the other."""

    @property
    def target_t1(self) -> float:
        return self._core.target_t1

    def _lists(self):
        return self._core.py_lists()

    @property
    def t1(self) -> dict:
        return self._keyed(self._lists()[0])

    @property
    def t2(self) -> dict:
        return self._keyed(self._lists()[1])

    @property
    def b1(self) -> dict:
        return self._keyed(self._lists()[2])

    @property
    def b2(self) -> dict:
        return self._keyed(self._lists()[3])
