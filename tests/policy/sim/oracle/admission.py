"""Admission: whether a block deserves a slot at all, composed around any eviction policy.

An :class:`Admitter` answers ``admit(key, info)``; :class:`Admitted` wraps a policy and asks
it before every insert of a non-resident key. A refused key is simply not stored (the caller
sees ``key not in cache``) and nothing is evicted. Eviction order stays the inner policy's.

Admitters here: vLLM's ``store_threshold`` (store a chunk only once it has been offered N
times; the one rule, used by every flow), TensorRT-LLM's ``secondary_offload_min_priority``
gate (``>=`` as coded, ``>`` as documented), and a score threshold for learned models (the
model outputs a score; the threshold is a separate, swept parameter). An admitter declares
``reads_info`` when its decision reads the :class:`BlockInfo` it is given.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from kvtier.collector.events import PRIORITY_MAX, PRIORITY_MIN
from kvtier.policy.sim.policies.base import DEFAULT_INFO, BlockInfo, CachePolicy, Key
from tests.policy.sim.oracle.lru import LRU


class Admitter(Protocol):
    """Decides whether a candidate block is stored. May keep state (offer counts)."""

    name: str
    reads_info: bool

    def admit(self, key: Key, info: BlockInfo) -> bool: ...


class Admitted:
    """``policy`` with ``admitter`` in front of its inserts; otherwise the same protocol."""

    def __init__(self, policy: CachePolicy, admitter: Admitter) -> None:
        self.policy = policy
        self.admitter = admitter
        self.name = f"{admitter.name}+{policy.name}"
        self.capacity_blocks = policy.capacity_blocks
        self.reads_info = policy.reads_info or getattr(admitter, "reads_info", True)
        self.uses_future = policy.uses_future
        self.request_scoped = policy.request_scoped

    def __contains__(self, key: Key) -> bool:
        return key in self.policy

    def __len__(self) -> int:
        return len(self.policy)

    def __iter__(self):
        return iter(self.policy)

    def touch(self, key: Key, info: BlockInfo = DEFAULT_INFO) -> None:
        self.policy.touch(key, info)

    def insert(self, key: Key, info: BlockInfo = DEFAULT_INFO) -> list[Key]:
        if key not in self.policy and not self.admitter.admit(key, info):
            return []
        return self.policy.insert(key, info)

    def remove(self, key: Key) -> None:
        self.policy.remove(key)

    def pop_victim(self) -> Key:
        return self.policy.pop_victim()

    def evict(self, n: int, protected=()) -> list[Key] | None:
        return self.policy.evict(n, protected)

    def begin(self) -> None:
        self.policy.begin()

    def finish(self) -> None:
        self.policy.finish()

    def on_miss(self, keys) -> None:
        self.policy.on_miss(keys)


class OfferCountAdmitter:
    """vLLM's ``store_threshold``: a key is stored once it has been offered ``min_offers``
    times (0 or 1: always), as vLLM 0.33's ``CPUOffloadingManager`` counts them.

    Offers are counted in an LRU-bounded tracker of ``max_tracked`` keys (vLLM's
    ``max_tracker_size``, default 64000); a key the tracker forgets starts again, and the keys
    of the offer being counted are never the ones forgotten. An engine offers a request's new
    blocks together (:meth:`offer`); a victim cache offers one block at a time (:meth:`admit`).
    """

    name = "store_threshold"
    reads_info = False

    def __init__(self, min_offers: int, max_tracked: int = 64000) -> None:
        if min_offers < 0 or max_tracked <= 0:
            raise ValueError(f"min_offers must be >= 0 and max_tracked > 0, got "
                             f"{min_offers} and {max_tracked}")
        self.min_offers = min_offers
        self.max_tracked = max_tracked
        self._order = LRU(None)  # least recently offered first
        self._counts: dict = {}

    @property
    def counting(self) -> bool:
        """Whether offers are counted at all (``min_offers`` >= 2)."""
        return self.min_offers >= 2

    def offer(self, keys) -> None:
        """One offer of ``keys``: each tracked key counts once more, each new one starts at 1."""
        if not self.counting:
            return
        order, counts = self._order, self._counts
        counted = set()
        for key in keys:
            if key in order:
                order.touch(key)
                counts[key] += 1
                counted.add(key)
        forgettable = len(order) - len(counted)
        for key in keys:
            if key in order:
                continue
            if len(order) >= self.max_tracked:
                if forgettable == 0:
                    continue
                del counts[order.pop_victim()]
                forgettable -= 1
            order.insert(key)
            counts[key] = 1

    def passes(self, key: Key) -> bool:
        """Whether ``key`` has been offered often enough to be stored."""
        return not self.counting or self._counts.get(key, 0) >= self.min_offers

    def admit(self, key: Key, info: BlockInfo) -> bool:
        self.offer((key,))
        return self.passes(key)


COMPARISONS = ("ge", "gt")


@dataclass(frozen=True)
class PriorityAdmitter:
    """TensorRT-LLM's offload gate: a GPU victim goes to host memory only if its priority
    passes ``min_priority``. ``comparison="ge"`` is the C++ code (``>=``, default 30);
    ``"gt"`` is the documented rule (``>``; the docs give a default of 35)."""

    min_priority: int = 30
    comparison: str = "ge"
    name: str = "secondary_offload_min_priority"
    reads_info: bool = True

    def __post_init__(self) -> None:
        if self.comparison not in COMPARISONS:
            raise ValueError(f"comparison must be one of {', '.join(COMPARISONS)}, "
                             f"got {self.comparison!r}")
        if not PRIORITY_MIN <= self.min_priority <= PRIORITY_MAX:
            raise ValueError(f"min_priority must be in {PRIORITY_MIN}..{PRIORITY_MAX}, "
                             f"got {self.min_priority}")

    def admit(self, key: Key, info: BlockInfo) -> bool:
        if self.comparison == "ge":
            return info.priority >= self.min_priority
        return info.priority > self.min_priority


class ScoreAdmitter:
    """Admit when ``score(key, info) >= threshold`` (the learned model's plug-in point)."""

    name = "score"
    reads_info = True

    def __init__(self, score: Callable[[Key, BlockInfo], float], threshold: float) -> None:
        self.score = score
        self.threshold = threshold

    def admit(self, key: Key, info: BlockInfo) -> bool:
        return self.score(key, info) >= self.threshold
