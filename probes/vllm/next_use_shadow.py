"""The learned next-use order behind an online LRU shadow, in the engine: what kvtier's vLLM
cache-policy plug-in (``probes/vllm/next_use_policy.py``) and its replay twin
(``probes/vllm/next_use_twin.py``) both run, so the engine and the replay follow the same
order at the same requests. Standard library only, like the plug-in.

The replay's deployed pairs run behind plain LRU's shadow too (``policy/learn/shadowed.py``,
over the simulator's exclusive tiers, where every tier's contents are known); this one sees
only what a vLLM cache policy is told: the blocks a request loaded from the tier or stored
into it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

# as the replay's deployed pair (policy/learn/pairs.py): a 500-request window kept an order
# that had turned bad long enough to lose points to LRU after a shift; 100 did not
SHADOW_WINDOW_REQUESTS = 100  # the shadow's scores decay over this many requests
SHADOW_MARGIN = 0.002  # of the window's blocks: what another order must exceed to take over
# a ghost grows past its capacity by 1/64 before it evicts back down to it: the learned order
# ranks every owning request per eviction, so the ghost ranks them once per 1/64 of its
# capacity rather than once per request (both ghosts alike, so neither holds more; an eighth
# cost the agentic traffic's small tiers up to 1.4 points, 1/64 about 0.2)
GHOST_SLACK_DIVISOR = 64


class ShadowedNextUse:
    """The learned order behind an online LRU shadow, over the same calls as the plug-in's
    ``NextUseState`` (what the vLLM class and the replay twin drive); ``new_order()`` makes
    an empty learned order (the tier's, and the learned ghost's).

    Two ghosts, directories of block ids at the tier's capacity that hold no data, are offered
    each finished request's blocks (those it loaded from the tier or stored into it that the
    tier still holds, in prompt order): one kept in LRU order, one in the learned order. A
    ghost scores the blocks it already held. The scores decay with a window of
    ``window_requests`` requests, and the tier evicts in the order of the ghost that leads,
    switching only when the other leads it by more than ``margin`` of the window's blocks.
    It starts in LRU order: the learned order takes the tier once its ghost has served more.
    LRU here is by request: when a request ends, its blocks become the most recent, its first
    block last of all (vLLM's LRU policy renews a finished request's blocks so); a block
    stored with no request goes first. A ghost evicts back to its capacity once it holds 1/64
    more (:data:`GHOST_SLACK_DIVISOR`). State besides the learned order's: one entry per
    resident block and one per block of each ghost; per finished request one pass over its
    blocks for each ghost, and once per 1/64 of the capacity offered one ranking of the
    learned ghost's owning requests."""

    def __init__(self, new_order: Callable[[], object], capacity: int, *,
                 window_requests: int = SHADOW_WINDOW_REQUESTS,
                 margin: float = SHADOW_MARGIN) -> None:
        if capacity < 1 or window_requests < 1 or not margin >= 0:
            raise ValueError(f"a shadow needs capacity >= 1, window_requests >= 1 and "
                             f"margin >= 0, got {capacity!r}, {window_requests!r}, {margin!r}")
        self.capacity, self.window_requests, self.margin = capacity, window_requests, margin
        self.slack = max(1, capacity // GHOST_SLACK_DIVISOR)
        self.state = new_order()   # the learned order over the resident blocks
        self._recency: OrderedDict = OrderedDict()  # the resident blocks, least recent first
        self._lru_ghost: OrderedDict = OrderedDict()
        self._learned_ghost = new_order()
        self.following = "lru"
        self.switches = 0
        self.scores = {"lru": 0.0, "learned": 0.0, "blocks": 0.0}  # decayed over the window

    @property
    def model(self):
        return self.state.model

    @property
    def now_s(self) -> float:
        return self.state.now_s

    def request(self, req_id: str, params: dict | None):
        return self.state.request(req_id, params)

    def used(self, request, key: int, position: int, stored: bool) -> None:
        self.state.used(request, key, position, stored)
        if stored:
            self._recency[key] = None
            self._recency.move_to_end(key)

    def finished(self, req_id: str) -> None:
        request = self.state.running(req_id)
        if request is None:
            return
        self.state.finished(req_id)  # its signals now say how it ended
        # the blocks it loaded or stored that the tier still holds, head to tail (a vLLM
        # engine never tells its policy of a store it dropped for want of room; the replay's
        # flow stores and then evicts it)
        blocks = sorted(((key, position) for key, position in request.used.items()
                         if self.state.holds(key)), key=lambda kv: kv[1])
        for key, _ in reversed(blocks):  # its first block the most recent of all
            if key in self._recency:
                self._recency.move_to_end(key)
        self._offer(req_id, request, blocks)

    def _offer(self, req_id: str, request, blocks: list) -> None:
        """The finished request's blocks offered to both ghosts; the scores, and the order
        the tier follows."""
        lru, ghost = self._lru_ghost, self._learned_ghost
        lru_hits = sum(1 for key, _ in blocks if key in lru)
        for key, _ in reversed(blocks):
            lru[key] = None
            lru.move_to_end(key)
        if len(lru) > self.capacity + self.slack:
            while len(lru) > self.capacity:
                lru.popitem(last=False)
        learned_hits = 0
        shadow = ghost.request(req_id, {"kvtier": {"arrival_s": request.arrival_s}})
        for key, position in blocks:
            held = ghost.holds(key)
            learned_hits += held
            ghost.used(shadow, key, position, not held)
        over = ghost.resident() - self.capacity
        if over > self.slack:  # the request's own blocks stay (as the tier's running request's do)
            for key in ghost.order(over, shadow.used.__contains__):
                ghost.forget(key)
        ghost.finished(req_id, folded=request)  # ranked as the tier's order ranks it
        keep = 1.0 - 1.0 / self.window_requests
        scores = self.scores
        for name, value in (("lru", lru_hits), ("learned", learned_hits), ("blocks", len(blocks))):
            scores[name] = scores[name] * keep + value
        other = "learned" if self.following == "lru" else "lru"
        if scores[other] - scores[self.following] > self.margin * scores["blocks"]:
            self.following = other
            self.switches += 1

    def pin(self, order: str) -> None:
        """Keep the tier in ``order`` (``"lru"`` or ``"learned"``) whatever the ghosts score
        (a diagnostic: the learned order pinned is the order alone, at the shadow's cost)."""
        if order not in ("lru", "learned"):
            raise ValueError(f"order must be lru or learned, got {order!r}")
        self.following, self.margin = order, float("inf")

    def holds(self, key: int) -> bool:
        return self.state.holds(key)

    def resident(self) -> int:
        return self.state.resident()

    def orphan(self, key: int) -> None:
        self.state.orphan(key)
        self._recency[key] = None
        self._recency.move_to_end(key, last=False)

    def forget(self, key: int) -> None:
        self.state.forget(key)
        self._recency.pop(key, None)

    def order(self, n: int, skip) -> list:
        """The first ``n`` blocks to go in the order the tier follows, passing over
        ``skip(key)``."""
        if self.following == "learned":
            return self.state.order(n, skip)
        out = []
        for key in self._recency:
            if not skip(key):
                out.append(key)
                if len(out) == n:
                    break
        return out
