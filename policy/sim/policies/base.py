"""The one tier protocol every cache policy implements, and the base class that owns capacity.

A tier holds blocks and an eviction order. Its protocol:

* ``key in tier``, ``len(tier)``, ``iter(tier)``, ``capacity_blocks``;
* ``touch(key, info)``: a use of a resident key; ``insert(key, info) -> victims``: store a key,
  evicting as needed; ``remove(key)``: forget a resident key (promoted or dropped elsewhere);
* ``evict(n, protected) -> victims | None``: make room for ``n``, atomically (all ``n``
  victims outside ``protected``, or ``None`` and nothing changes); ``pop_victim()``: one;
* ``begin()`` / ``finish()``: a request's scope. Request-scoped tiers (vLLM's CPU cores) apply a
  request's recency once, at ``finish``; per-access policies ignore both;
* ``on_miss(keys)``: blocks a store looked for and did not find (ghost hits adapt ARC).

Each policy declares what it needs (class attributes, read by the flows instead of its name):
``reads_info`` (its order reads :class:`BlockInfo` priority or next use, so a block's info must
travel with it between tiers), ``uses_future`` (it needs each block's next use: Belady) and
``request_scoped`` (``begin``/``finish`` matter).

Modelled on cachetools: a per-access policy is a small subclass that keeps its own order (a
list, a heap, queues) and answers four questions; :class:`CachePolicy` does the accounting
around them, in one place, so no policy can overfill or forget a victim:

* ``_store(key, info)``   remember a newly admitted key;
* ``_hit(key, info)``     a resident key was used again;
* ``_evict() -> key``     choose one resident victim and forget it;
* ``_forget(key)``        drop a resident key the caller removes (a promotion, a drop).

Capacity is in blocks; ``None`` means unlimited. Inserting never fails part-way: either the key
is admitted and every victim needed to make room is returned, or (capacity 0, admission said
no) the key is not resident afterwards and nothing was evicted.
"""

from __future__ import annotations

from collections.abc import Collection, Hashable, Sequence

Key = Hashable
NEVER = float("inf")  # next_use of a block that is not referenced again


class BlockInfo:
    """What the simulator knows about one block reference, for policies that need more than
    recency: its TensorRT-LLM retention ``priority`` (0..100), the global index of its next
    reference (``next_use``, :data:`NEVER` if none; only Belady reads it), and ``position``
    in its request's prompt."""

    __slots__ = ("next_use", "position", "priority")

    def __init__(self, priority: int = 35, next_use: float = NEVER, position: int = 0) -> None:
        self.priority = priority
        self.next_use = next_use
        self.position = position


DEFAULT_INFO = BlockInfo()


def checked_capacity(capacity_blocks: int | None) -> int | None:
    """``capacity_blocks`` if it is an int >= 0 or ``None`` (unlimited); ``ValueError``
    otherwise."""
    if capacity_blocks is not None and (isinstance(capacity_blocks, bool)
                                        or not isinstance(capacity_blocks, int)
                                        or capacity_blocks < 0):
        raise ValueError(f"capacity_blocks must be an int >= 0 or None (unlimited), "
                         f"got {capacity_blocks!r}")
    return capacity_blocks


class CachePolicy:
    """Base class: membership, size and capacity; subclasses choose the order."""

    name = "base"
    reads_info = False
    uses_future = False
    request_scoped = False

    def __init__(self, capacity_blocks: int | None) -> None:
        self.capacity_blocks = checked_capacity(capacity_blocks)
        self._resident: set = set()

    def __contains__(self, key: Key) -> bool:
        return key in self._resident

    def __len__(self) -> int:
        return len(self._resident)

    def __iter__(self):
        return iter(self._resident)

    def touch(self, key: Key, info: BlockInfo = DEFAULT_INFO) -> None:
        """Record a use of a resident key (a hit). ``KeyError`` if it is not resident."""
        if key not in self._resident:
            raise KeyError(key)
        self._hit(key, info)

    def insert(self, key: Key, info: BlockInfo = DEFAULT_INFO) -> list[Key]:
        """Admit a non-resident key, evicting as needed; returns the victims, oldest first.

        A resident key is touched instead. With capacity 0 or a refusing admission the key
        stays out and ``[]`` is returned; callers check ``key in policy``.
        """
        if key in self._resident:
            self._hit(key, info)
            return []
        if not self._admit(key, info):
            return []
        self._before_insert(key, info)
        victims = []
        capacity = self.capacity_blocks
        if capacity is not None:
            while len(self._resident) >= capacity and self._resident:
                victim = self._evict()
                self._resident.discard(victim)
                victims.append(victim)
        self._resident.add(key)
        self._store(key, info)
        return victims

    def remove(self, key: Key) -> None:
        """Forget a resident key (moved to another tier or dropped). ``KeyError`` if absent."""
        self._resident.remove(key)
        self._forget(key)

    def pop_victim(self) -> Key:
        """Evict one key now (used when another tier must make room). ``KeyError`` if empty."""
        if not self._resident:
            raise KeyError("pop_victim from an empty cache")
        victim = self._evict()
        self._resident.discard(victim)
        return victim

    def evict(self, n: int, protected: Collection[Key] = ()) -> list[Key] | None:
        """``n`` victims in eviction order, or ``None`` (nothing evicted) when fewer than
        ``n`` are resident. A per-access policy evicts in its own order and cannot pass over a
        block: ``protected`` must be empty (request-scoped tiers override this)."""
        if protected:
            raise ValueError(f"{self.name} evicts in its own order; it cannot evict around "
                             f"protected blocks")
        if n > len(self._resident):
            return None
        return [self.pop_victim() for _ in range(n)]

    def begin(self) -> None:
        """A request starts (per-access policies: nothing to do)."""

    def finish(self) -> None:
        """The request ends (per-access policies: nothing to do)."""

    def on_miss(self, keys: Sequence[Key]) -> None:
        """Blocks a store looked for and did not find (per-access policies: nothing)."""

    # ---- what a policy implements ----

    def _admit(self, key: Key, info: BlockInfo) -> bool:
        return self.capacity_blocks != 0

    def _before_insert(self, key: Key, info: BlockInfo) -> None:
        """Runs before room is made for ``key`` (ARC adapts its target here)."""

    def _store(self, key: Key, info: BlockInfo) -> None:
        raise NotImplementedError

    def _hit(self, key: Key, info: BlockInfo) -> None:
        raise NotImplementedError

    def _evict(self) -> Key:
        raise NotImplementedError

    def _forget(self, key: Key) -> None:
        raise NotImplementedError
