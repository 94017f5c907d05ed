"""Admission: whether a block deserves a slot at all, composed around any eviction policy.

An :class:`Admitter` answers ``admit(key, info)``; :class:`Admitted` wraps a policy and asks
it before every insert of a non-resident key. A refused key is simply not stored (the caller
sees ``key not in cache``) and nothing is evicted. Eviction order stays the inner policy's.
An admitter that counts requests rather than offers has ``sight(keys)``: whoever serves the
requests calls it with each request's blocks before serving it (the flows do;
:meth:`Admitted.sight` passes it on).

Admitters here: vLLM's ``store_threshold`` (store a chunk only once it has been offered N
times; the one rule, used by every flow), the sighting filter (admit a block on the N-th
request that references it, counted by the same rule), TensorRT-LLM's ``secondary_offload_min_priority``
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
from kvtier.policy.sim.compiled import core


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
        # a tier of the protocol declares these only when they hold (CachePolicy: all three)
        self.reads_info = (getattr(policy, "reads_info", False)
                           or getattr(admitter, "reads_info", True))
        self.uses_future = getattr(policy, "uses_future", False)
        self.request_scoped = getattr(policy, "request_scoped", False)

    def __contains__(self, key: Key) -> bool:
        return key in self.policy

    def __len__(self) -> int:
        return len(self.policy)

    def __iter__(self):
        return iter(self.policy)

    def sight(self, keys) -> None:
        """A request references ``keys`` (an admitter that counts requests is told)."""
        sight = getattr(self.admitter, "sight", None)
        if sight is not None:
            sight(keys)

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
    The counting is the compiled core's ``StoreThreshold``, the one used by every flow.
    """

    name = "store_threshold"
    reads_info = False

    def __init__(self, min_offers: int, max_tracked: int = 64000) -> None:
        if min_offers < 0 or max_tracked <= 0:
            raise ValueError(f"min_offers must be >= 0 and max_tracked > 0, got "
                             f"{min_offers} and {max_tracked}")
        self.min_offers = min_offers
        self.max_tracked = max_tracked
        self._core = core().StoreThreshold(min_offers, max_tracked)
        self._ids: dict = {}

    @property
    def counting(self) -> bool:
        """Whether offers are counted at all (``min_offers`` >= 2)."""
        return self.min_offers >= 2

    def compiled(self):
        """The compiled counter, for a flow to drive with its own ids (only while unused)."""
        if self._ids:
            raise ValueError("a store_threshold admitter that has counted offers cannot join a flow")
        return self._core

    def _id(self, key: Key) -> int:
        return self._ids.setdefault(key, len(self._ids))

    def offer(self, keys) -> None:
        """One offer of ``keys``: each tracked key counts once more, each new one starts at 1."""
        if self.counting:
            self._core.py_count([self._id(k) for k in keys])

    def passes(self, key: Key) -> bool:
        """Whether ``key`` has been offered often enough to be stored."""
        return not self.counting or (key in self._ids and self._core.py_passes(self._ids[key]))

    def admit(self, key: Key, info: BlockInfo) -> bool:
        self.offer((key,))
        return self.passes(key)


class SightingAdmitter(OfferCountAdmitter):
    """The sighting filter: a block is admitted on the ``min_sightings``-th request that
    references it (0 or 1: always), whichever tier served it. It counts as vLLM's
    ``store_threshold`` does (the same tracker: ``max_tracked`` blocks, least recently seen
    forgotten first), but every request counts its blocks (:meth:`sight`, which a flow calls
    before serving the request) and an offer to the tier counts nothing. In vLLM's own
    engine the two are one: its scheduler offers a request's prompt blocks to the CPU tier
    from the first block whenever it loads none from it.

    Memory: the tracker holds at most ``max_tracked`` blocks, whatever the traffic (in vLLM's
    engine one ``OrderedDict`` entry per block; ``benchmarks/sighting_filter.py`` measures
    its bytes and its cost per block)."""

    name = "sightings"
    reads_info = False

    def __init__(self, min_sightings: int, max_tracked: int = 64000) -> None:
        super().__init__(min_sightings, max_tracked)

    @property
    def min_sightings(self) -> int:
        return self.min_offers

    def sight(self, keys) -> None:
        """One request that references ``keys``: each counts once more."""
        self.offer(keys)

    def admit(self, key: Key, info: BlockInfo) -> bool:
        return self.passes(key)

    def compiled_admitter(self, interner):
        """The compiled filter for a flow (its own tracker: the flow counts its requests)."""
        return core().SightingFilter(self.min_offers, self.max_tracked)


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
