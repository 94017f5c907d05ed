"""The learned next-use order written per key in Python: the oracle the replay core's
``NextUseOrder`` is checked against (the rules: ``policy/learn/nextuse_tier.py``), and the
driver that serves per-key tiers request by request (each sees a request before it is
served). The readouts per row (:func:`finished_view`, :func:`arrival_scale_of`,
:func:`next_use_s`, :func:`reuse_within`) are the scalar oracle of the model's vectorised
``finished_views``/``arrival_scales`` and of the engine plug-in's ranking."""

from __future__ import annotations

import bisect
import dataclasses
import heapq
import math
from collections import OrderedDict
from collections.abc import Callable, Collection, Sequence

from kvtier.collector.events import RequestRecord
from kvtier.policy.learn.nextuse import GapTable, NextUseModel, Readout
from kvtier.policy.learn.replay import Replayed, RequestTokens, Tiers
from kvtier.policy.learn.request_signals import FINISH_CLASSES, SignalTracker
from kvtier.policy.sim.config import SimConfig
from kvtier.policy.sim.result import SimResult
from kvtier.policy.sim.simulator import Simulator
from kvtier.policy.sim.trace import BlockTrace


def replay_per_key(records: Sequence[RequestRecord], tiers: Tiers, build: Callable, *,
                   count_from: int = 0, trace: BlockTrace | None = None) -> Replayed:
    """:func:`kvtier.policy.learn.replay.replay` for a per-key CPU tier with ``observe_request``."""
    from kvtier.policy.learn.offers import _block_tokens

    config = SimConfig(gpu_blocks=tiers.gpu_blocks, cpu_blocks=tiers.cpu_blocks,
                       cold_blocks=tiers.cold_blocks, policy="lru",
                       default_block_tokens=_block_tokens(records))
    cpu = build(tiers.cpu_blocks)
    return _watched(Simulator(config, cpu_tier=cpu), records, cpu.observe_request, count_from,
                    len(records), trace, None)


def _watched(simulator: Simulator, records: Sequence[RequestRecord], watcher,
             count_from: int, end: int, trace: BlockTrace | None, on_request) -> Replayed:
    """Serve request by request, showing each to the tier first with its blocks (from the
    trace's arrays when the records carry none)."""
    start_totals, counted, outcomes = SimResult(), [], []
    for index, record in enumerate(records[:end]):
        if index == count_from:
            start_totals = simulator.result
        if trace is not None and not record.block_hashes:
            record = dataclasses.replace(record,
                                         block_hashes=tuple(trace.blocks(index).tolist()))
        watcher(index, record, record.block_hashes)
        outcome = simulator.serve(record)
        if index >= count_from:
            counted.append(record)
            outcomes.append(RequestTokens(outcome.gpu_hit_tokens, outcome.cpu_promotion_tokens,
                                          outcome.cold_promotion_tokens,
                                          outcome.recompute_tokens))
        if on_request is not None:
            on_request(index)
    return Replayed(simulator.result.minus(start_totals), tuple(counted), tuple(outcomes))



class NextUseTier:
    """The learned next-use order per key: the tier protocol of ``kvtier.policy.sim.policies``
    (exclusive flows) plus ``observe_request``."""

    name = "learned-next-use"
    reads_info = False

    def __init__(self, capacity_blocks: int | None, model: NextUseModel, readout: Readout,
                 *, tracker: SignalTracker | None = None) -> None:
        self.capacity_blocks = capacity_blocks
        self.model = model
        self.readout = readout
        self.tracker = tracker if tracker is not None else SignalTracker(model.models)
        self._own_tracker = tracker is None
        self.now_s = 0.0
        self._dead: OrderedDict = OrderedDict()
        self._group: dict = {}          # block -> owner request
        self._members: dict = {}        # owner -> {block: position}
        self._slots: dict = {}          # owner -> its members by position (None: not held)
        self._top: dict = {}            # owner -> no member sits deeper than this position
        self._views: dict = {}          # owner -> (table, p, scale) once finished
        self._arrival_scales: dict = {}  # owner -> arrival scale (its row is fixed while running)
        elapsed = model.running.elapsed
        self._grid_sorted = all(a <= b for a, b in zip(elapsed, elapsed[1:]))
        self._epoch = None
        self._heap: list = []

    # ---- what the replay calls

    def observe_request(self, index: int, record: RequestRecord, blocks) -> None:
        """A request arrives (before it is served)."""
        if self._own_tracker:
            self.tracker.observe(index, record, blocks)
        self.now_s = record.arrival_s

    def __contains__(self, key) -> bool:
        return key in self._group or key in self._dead

    def __len__(self) -> int:
        return len(self._group) + len(self._dead)

    def __iter__(self):
        return iter([*self._group, *self._dead])

    def insert(self, key, info=None) -> list:
        # the replay's hottest call (every GPU victim): membership, deadness (superseded, or
        # a last block rarely re-sent) and size written out: a method call costs more than each
        group, dead = self._group, self._dead
        if key in group or key in dead:
            return []
        tracker = self.tracker
        owner, position = tracker.owner[key]
        if owner in tracker.successor or (self.readout.last_block_dead and
                                          position == tracker.requests[owner].blocks - 1):
            dead[key] = None
        else:
            members = self._members.get(owner)
            if members is None:
                members = self._members[owner] = {}
            fresh = not members
            members[key] = position
            slots = self._slots.get(owner)
            if slots is None:
                slots = self._slots[owner] = [None] * (position + 1)
                self._top[owner] = position
            elif position >= len(slots):
                slots.extend([None] * (position + 1 - len(slots)))
                self._top[owner] = position
            elif position > self._top[owner]:
                self._top[owner] = position
            slots[position] = key
            group[key] = owner
            if fresh and self._epoch == self.now_s:  # ranked this epoch: add it to the heap
                heapq.heappush(self._heap, (-self.rank(owner, members), owner))
        cap = self.capacity_blocks
        if cap is None or len(group) + len(dead) <= cap:
            return []
        victims = []
        while len(group) + len(dead) > cap:
            victims.append(self.pop_victim())
        return victims

    def touch(self, key, info=None) -> None:
        if key not in self:
            raise KeyError(key)

    def remove(self, key) -> None:
        if key in self._dead:
            del self._dead[key]
            return
        owner = self._group.pop(key)
        members = self._members[owner]
        self._slots[owner][members.pop(key)] = None
        if not members:
            self._release_slots(owner)

    def pop_victim(self):
        if self._dead:
            return self._dead.popitem(last=False)[0]
        if not self._group:
            raise KeyError("pop_victim from an empty tier")
        if self._epoch != self.now_s:
            self._epoch = self.now_s
            self._heap = [(-self.rank(o, m), o) for o, m in self._members.items() if m]
            heapq.heapify(self._heap)
        while True:
            owner = self._heap[0][1]
            members = self._members.get(owner)
            if members:
                break
            heapq.heappop(self._heap)
            self._drop_owner(owner)
        victim = self._pop_deepest(owner)
        del members[victim]
        del self._group[victim]
        if not members:
            self._release_slots(owner)
        return victim

    def evict(self, n: int, protected: Collection = ()) -> list | None:
        if protected:
            raise ValueError("learned-next-use evicts in its own order; no protected blocks")
        if n > len(self):
            return None
        return [self.pop_victim() for _ in range(n)]

    # ---- ranking

    def _pop_deepest(self, owner: int):
        """The group's member at the deepest position (positions are distinct within a
        request), taken out of its slots: a scan down from the deepest ever held, so
        evicting a whole group costs its length once, not once per block."""
        slots = self._slots[owner]
        top = self._top[owner]
        while slots[top] is None:
            top -= 1
        victim = slots[top]
        slots[top] = None
        self._top[owner] = top
        return victim

    def _release_slots(self, owner: int) -> None:
        self._slots.pop(owner, None)
        self._top.pop(owner, None)

    def _drop_owner(self, owner: int) -> None:
        self._members.pop(owner, None)
        self._release_slots(owner)
        self._views.pop(owner, None)
        self._arrival_scales.pop(owner, None)

    def rank(self, owner: int, members: dict) -> float:
        """Eviction priority of a group now: larger goes first."""
        if self.tracker.superseded(owner):
            return math.inf
        readout, now = self.readout, self.now_s
        request = self.tracker.requests[owner]
        if now >= request.finish_s:
            view = self._views.get(owner)
            if view is None:
                row = self.tracker.features(owner, now)
                view = self._views[owner] = finished_view(
                    self.model, FINISH_CLASSES[int(row[12])], row)
            table, p, scale = view
            waited = now - request.finish_s
        elif not self.model.running.elapsed:
            return math.inf
        else:
            scale = self._arrival_scales.get(owner)
            if scale is None:  # a running request's row is its arrival row until it finishes
                row = self.tracker.features(owner, now)
                scale = self._arrival_scales[owner] = arrival_scale_of(self.model, row)
            elapsed = (now - request.arrival_s) / scale
            grid = self.model.running.elapsed
            k = max(0, (bisect.bisect_right(grid, elapsed) if self._grid_sorted
                        else sum(1 for e in grid if e <= elapsed)) - 1)
            table = self.model.running.tables[k]
            p = 1.0 - table.never_fraction
            waited = (elapsed - self.model.running.elapsed[k]) * scale
        if len(table.quantiles) < 2:
            return math.inf
        if readout.kind == "next_use":
            return next_use_s(table, p, scale, waited, readout.q)
        return -reuse_within(table, p, scale, waited, readout.horizon_s)


def finished_view(model: NextUseModel, finish_class: str, row: Sequence[float]
                  ) -> tuple[GapTable, float, float]:
    """(table, p, scale) for a finished request's row."""
    table = model.table(finish_class)
    p = model.continuation.predict(row) if model.continuation else 1.0 - table.never_fraction
    s = math.exp(model.gap_scale.predict(row)) if model.gap_scale else 1.0
    return table, p, max(s, 1e-3)


def arrival_scale_of(model: NextUseModel, row: Sequence[float]) -> float:
    return max(math.exp(model.arrival_scale.predict(row)), 1e-3) if model.arrival_scale else 1.0


def _conditional(table: GapTable, p: float, e: float, u: float | None, horizon: float | None
                 ) -> float:
    """Given waited ``e`` (normalised): with ``horizon``, P(next use within it); with ``u``,
    the ``u``-quantile of the remaining time (inf when the chain more likely never comes)."""
    f0 = table.cdf(e)
    survive = 1.0 - p * f0
    if survive <= 1e-12:
        return 1.0 if horizon is not None else 0.0
    if horizon is not None:
        return p * (table.cdf(e + horizon) - f0) / survive
    target = f0 + u * survive / p if p > 0 else math.inf
    if target > 1.0:
        return math.inf
    return max(0.0, table.inverse(target) - e)


def next_use_s(table: GapTable, p: float, scale: float, waited_s: float, q: float) -> float:
    """Seconds until the next use at quantile ``q``, given ``waited_s`` already waited."""
    return scale * _conditional(table, p, waited_s / scale, q, None)


def reuse_within(table: GapTable, p: float, scale: float, waited_s: float, horizon_s: float
                 ) -> float:
    """P(next use within ``horizon_s`` | not yet after ``waited_s``)."""
    return _conditional(table, p, waited_s / scale, None, horizon_s / scale)
