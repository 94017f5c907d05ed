"""The shadowed tier written per key in Python: the oracle the replay core's ``Shadow`` is
checked against (the rule: ``policy/learn/shadowed.py``). Its candidates are any per-key
orders, so a test can put a deliberately bad one behind the shadow."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Collection, Sequence

from kvtier.collector.events import RequestRecord
from kvtier.policy.learn.shadowed import MARGIN, WINDOW_REQUESTS, ShadowStats


class RecencyOrder:
    """LRU over the blocks it is given (exclusive tiers: a block is stored once, used never)."""

    name = "lru"

    def __init__(self, capacity_blocks: int | None) -> None:
        self.capacity_blocks = capacity_blocks
        self._order: OrderedDict = OrderedDict()

    def __contains__(self, key) -> bool:
        return key in self._order

    def __len__(self) -> int:
        return len(self._order)

    def insert(self, key, info=None) -> list:
        self._order[key] = None
        victims = []
        while self.capacity_blocks is not None and len(self._order) > self.capacity_blocks:
            victims.append(self._order.popitem(last=False)[0])
        return victims

    def remove(self, key) -> None:
        del self._order[key]

    def pop_victim(self):
        return self._order.popitem(last=False)[0]


class Shadowed:
    """The shadowed tier per key: the tier protocol (exclusive flows) plus
    ``observe_request``. ``candidates``: (name, factory) or (name, factory, admitter), a
    factory building a tier at a capacity (``None``: unbounded), an admitter (``admit(key,
    info)``, and ``sight(keys)`` when it counts requests; ``None``: every block); the first is
    the baseline and the starting order. ``observers`` see each request first (a shared signal
    tracker)."""

    name = "learned-safe"
    reads_info = False

    def __init__(self, capacity_blocks: int, candidates: Sequence[tuple[str, Callable]], *,
                 window_requests: int = WINDOW_REQUESTS, margin: float = MARGIN,
                 observers: Sequence[Callable] = ()) -> None:
        # inputs as the product tier validates them (``kvtier.policy.learn.shadowed.Shadowed``)
        self.capacity_blocks = capacity_blocks
        self.names = tuple(c[0] for c in candidates)
        self.ghosts = [c[1](capacity_blocks) for c in candidates]
        self.orders = [c[1](None) for c in candidates]
        self.admitters = [c[2] if len(c) > 2 else None for c in candidates]
        self._watchers = [*observers, *(getattr(t, "observe_request", None)
                                        for t in (*self.ghosts, *self.orders))]
        self._watchers = [w for w in self._watchers if w is not None]
        self._real: set = set()
        self._gpu: set = set()
        self.mode = 0
        self._keep = 1.0 - 1.0 / window_requests
        self._window = window_requests
        self.margin = margin
        self._scores = [0.0] * len(candidates)
        self._real_score = 0.0
        self._tokens = 0.0
        self._seen = 0
        self.switches = 0
        self._by_mode = [0] * len(candidates)
        self._worst: float | None = None
        self._ghost_tokens = [0] * len(candidates)
        self._real_tokens = 0

    # ---- per request

    def observe_request(self, index: int, record: RequestRecord, blocks) -> None:
        for watch in self._watchers:
            watch(index, record, blocks)
        for admitter in {id(a): a for a in self.admitters}.values():  # a shared one once
            if hasattr(admitter, "sight"):
                admitter.sight(blocks)
        keep = self._keep
        bt = record.block_size_tokens or 16
        prompt = record.prompt_tokens
        self._tokens = self._tokens * keep + prompt
        for k, ghost in enumerate(self.ghosts):
            served = self._served(ghost, blocks, bt, prompt)
            self._scores[k] = self._scores[k] * keep + served
            self._ghost_tokens[k] += served
        served = self._served(self._real, blocks, bt, prompt)
        self._real_score = self._real_score * keep + served
        self._real_tokens += served
        for h in blocks:  # every block of the request lands on the GPU: out of every ghost
            for ghost in self.ghosts:
                if h in ghost:
                    ghost.remove(h)
            self._gpu.add(h)
        self._seen += 1
        best = max(range(len(self._scores)), key=self._scores.__getitem__)
        if (best != self.mode
                and self._scores[best] - self._scores[self.mode] > self.margin * self._tokens):
            self.mode = best
            self.switches += 1
        self._by_mode[self.mode] += 1
        if self._seen > self._window and self._tokens > 0:
            lead = (self._real_score - self._scores[0]) / self._tokens
            self._worst = lead if self._worst is None else min(self._worst, lead)

    def _served(self, tier, blocks, bt: int, prompt: int) -> int:
        """Tokens ``tier`` would serve past the GPU's prefix (prefix-contiguous lookup)."""
        served = 0
        gpu = self._gpu
        for i, h in enumerate(blocks):
            if h in gpu:
                continue
            if h not in tier:
                break
            served += max(0, min(bt, prompt - i * bt))
        return served

    # ---- the tier protocol

    def __contains__(self, key) -> bool:
        return key in self._real

    def __len__(self) -> int:
        return len(self._real)

    def __iter__(self):
        return iter(list(self._real))

    def insert(self, key, info=None) -> list:
        self._gpu.discard(key)  # a GPU victim
        for ghost, admitter in zip(self.ghosts, self.admitters):
            if key not in ghost and (admitter is None or admitter.admit(key, info)):
                ghost.insert(key, info)
        admitter = self.admitters[self.mode]
        if key in self._real or (admitter is not None and not admitter.admit(key, info)):
            return []
        for order in self.orders:
            order.insert(key, info)
        self._real.add(key)
        victims = []
        while len(self._real) > self.capacity_blocks:
            victims.append(self.pop_victim())
        return victims

    def pop_victim(self):
        victim = self.orders[self.mode].pop_victim()
        for k, order in enumerate(self.orders):
            if k != self.mode and victim in order:
                order.remove(victim)
        self._real.discard(victim)
        return victim

    def remove(self, key) -> None:
        self._real.remove(key)
        for order in self.orders:
            if key in order:
                order.remove(key)

    def touch(self, key, info=None) -> None:
        if key not in self._real:
            raise KeyError(key)

    def evict(self, n: int, protected: Collection = ()) -> list | None:
        if protected:
            raise ValueError("learned-safe evicts in its own order; no protected blocks")
        if n > len(self._real):
            return None
        return [self.pop_victim() for _ in range(n)]

    def stats(self) -> ShadowStats:
        return ShadowStats(self.names, tuple(self._by_mode), self.switches,
                           None if self._worst is None else self._worst * 100,
                           tuple(self._ghost_tokens), self._real_tokens)
