"""The learned next-use order under vLLM semantics: what kvtier's vLLM cache-policy plug-in
decides, as a request-scoped tier for the simulator's vLLM flow.

vLLM's CPU tier is write-through and request-scoped: during a request it is told which blocks
were loaded (``touch``) and stored (``insert``, after ``evict`` made room around the
request's own blocks), then the request finishes (``finish``). A request that loaded
nothing from the CPU is offered to it from its first block (vLLM's scheduler, 0.32: the store
index moves past the hits only when a load happens), so a block the tier holds is reused even
when the GPU served it: the flow reports only loads, and :meth:`finish` adds those from the
request's blocks. (vLLM also stores again such a GPU hit the CPU tier no longer holds; the
flow does not, so the two agree only while that does not happen.) A request is known by
the blocks it touched or stored, at their positions,
and by what the gateway says of it (``observe_request``: session, type, model, arrival time
on the gateway's clock; how it finished when the engine says). A request is folded into the
signals when it finishes; until then its blocks are in use and go last.

Order: dead blocks first (the chain moved on without them, or a last block when those are
rarely re-sent), then groups by the model's readout at the current time (the group whose
chain comes back last first), each group deepest block first; ties by the order requests and
blocks were first seen. ``probes/vllm/next_use_policy.py`` implements the same rules with the
standard library only; a test holds the two to the same decisions.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Collection

from collector.events import FINISH_CLASSES, RequestRecord, finish_class
from policy.learn.nextuse import NextUseModel, next_use_s, reuse_within
from policy.learn.nextuse import Readout
from policy.sim.policies.base import BlockInfo

MAX_CHAINS = 65_536  # chain histories kept (least recently used dropped)


class _Req:
    __slots__ = ("arrival_s", "blocks", "chain", "finish_s", "row", "seq", "signals", "used",
                 "view")

    def __init__(self, seq: int, signals: dict) -> None:
        self.seq, self.signals = seq, signals
        self.arrival_s = float(signals.get("arrival_s", 0.0))
        self.used: dict = {}     # block -> position, as the tier saw them
        self.row = self.view = None   # view: (table, p, scale), once folded
        self.blocks = 0
        self.chain = None
        self.finish_s = self.arrival_s


def signals_of(record: RequestRecord) -> dict:
    """The per-request signals a gateway passes to the plug-in (``kv_transfer_params``)."""
    signals = {"arrival_s": record.arrival_s, "prompt_tokens": record.prompt_tokens,
               "block_tokens": record.block_size_tokens or 16}
    for name in ("session_id", "request_type", "parent_request_id", "model",
                 "finish_status", "stop_reason", "e2e_latency_s", "output_tokens"):
        value = getattr(record, name)
        if value is not None:
            signals[name] = value
    return signals


class VllmNextUseTier:
    """A request-scoped tier of the simulator's vLLM flow (and the plug-in's twin)."""

    name = "learned-next-use-vllm"
    reads_info = True       # positions come in BlockInfo
    request_scoped = True

    def __init__(self, capacity_blocks: int, model: NextUseModel, readout: Readout) -> None:
        self.capacity_blocks = capacity_blocks
        self.model, self.readout = model, readout
        self.now_s = 0.0
        self._seq = 0
        self._current: _Req | None = None
        self._owner: dict = {}          # resident block -> owning request (folded or current)
        self._position: dict = {}       # resident block -> position at its owner
        self._members: dict = {}        # owning request -> {resident block: position}
        self._dead: OrderedDict = OrderedDict()
        self._chains: OrderedDict = OrderedDict()  # chain key -> (last request, start_s)
        self._offered: list = []        # the current request's full prompt blocks
        self._loaded = False            # whether it loaded any from this tier
        self.decisions: list = []       # every eviction: the victims, in order

    # ---- requests

    def observe_request(self, index: int, record: RequestRecord, blocks) -> None:
        self.start(signals_of(record))
        bt = record.block_size_tokens or 16
        self._offered = list(blocks)[:record.prompt_tokens // bt]
        self._loaded = False

    def start(self, signals: dict) -> None:
        self._seq += 1
        self._current = _Req(self._seq, signals)
        self.now_s = self._current.arrival_s

    def touch(self, key, info=None) -> None:
        if key not in self._owner:
            raise KeyError(key)
        self._loaded = True
        self._note(key, info)

    def insert(self, key, info=None) -> list:
        request = self._current
        self._note(key, info)
        self._own(key, request, request.used[key])
        return []  # room is made by evict() first (vLLM's prepare_store)

    def _own(self, key, owner: _Req, position: int) -> None:
        old = self._owner.get(key)
        if old is not None:
            self._members[old].pop(key, None)
            if not self._members[old]:
                del self._members[old]
        self._owner[key] = owner
        self._position[key] = position
        self._members.setdefault(owner, {})[key] = position

    def _note(self, key, info) -> None:
        request = self._current
        position = info.position if info is not None else len(request.used)
        request.used.setdefault(key, position)

    def finish(self) -> None:
        request = self._current
        if request is None:
            return
        if not self._loaded:  # vLLM offered the GPU's hits too: those it holds are reused
            for position, key in enumerate(self._offered):
                if key in self._owner and key not in request.used:
                    self.touch(key, BlockInfo(position=position))
        self._current, self._offered = None, []
        self._fold(request)
        for key in request.used:
            if key in self._owner:
                self._own(key, request, request.used[key])
                if self._dead_now(request, request.used[key]):
                    self._dead[key] = None
                else:
                    self._dead.pop(key, None)

    def _fold(self, request: _Req) -> None:
        s = request.signals
        request.blocks = max(request.used.values(), default=-1) + 1
        key = ((s["session_id"], s.get("parent_request_id")
                if s.get("request_type") == "subagent" else None)
               if s.get("session_id") is not None else ("request", request.seq))
        prev, start_s = self._chains.pop(key, (None, request.arrival_s))
        self._chains[key] = (request, start_s)
        if len(self._chains) > MAX_CHAINS:
            self._chains.popitem(last=False)
        if prev is not None:
            prev.chain = "superseded"
        request.chain = key
        bt = int(s.get("block_tokens", 16))
        # the prompt's tokens when told (the connector, the gateway), else its full blocks'
        prompt = int(s.get("prompt_tokens") or request.blocks * bt)
        e2e = float(s.get("e2e_latency_s") or 0.0)
        request.finish_s = request.arrival_s + e2e
        cls = finish_class(s.get("finish_status"), s.get("stop_reason"))
        model = s.get("model")
        depth = prev.row[3] + 1 if prev is not None else 0.0
        request.row = [
            _log1p(prompt), float(s.get("request_type") == "subagent"),
            float(self.model.models.get(model, -1)) if model else -1.0, depth,
            _log1p(request.arrival_s - prev.finish_s) if prev else -1.0,
            _log1p(request.blocks - prev.blocks) if prev else _log1p(request.blocks),
            _log1p(prev.blocks) if prev else 0.0, _log1p(request.arrival_s - start_s),
            (prompt % bt) / bt,
            prev.row[12] if prev else -1.0, prev.row[13] if prev else -1.0,
            prev.row[14] if prev else -1.0, float(FINISH_CLASSES.index(cls)), _log1p(e2e),
            _log1p(float(s.get("output_tokens") or 0))]
        request.view = self.model.finished_view(cls, request.row)

    def _dead_now(self, owner: _Req, position: int) -> bool:
        if owner.chain == "superseded":
            return True
        return self.readout.last_block_dead and position == owner.blocks - 1

    # ---- the tier protocol

    def __contains__(self, key) -> bool:
        return key in self._owner

    def __len__(self) -> int:
        return len(self._owner)

    def __iter__(self):
        return iter(list(self._owner))

    def remove(self, key) -> None:
        owner = self._owner.pop(key)
        del self._position[key]
        self._dead.pop(key, None)
        members = self._members[owner]
        del members[key]
        if not members:
            del self._members[owner]

    def evict(self, n: int, protected: Collection = ()) -> list | None:
        victims = self.eviction_order(protected, n)
        if len(victims) < n:
            return None
        for key in victims:
            self.remove(key)
        self.decisions.append(tuple(victims))
        return victims

    def eviction_order(self, protected: Collection = (), n: int | None = None) -> list:
        """The first ``n`` evictable blocks to go (all of them without ``n``), in order.
        Cost: one readout per owning request (two table bisections; the trees ran once,
        when the request finished), a sort of those, and a sort of each group taken from
        until ``n`` are found."""
        protected = set(protected)
        out = [k for k in self._dead if k not in protected]
        if n is not None and len(out) >= n:
            return out[:n]
        ranked = sorted(self._members, key=lambda o: (-self._rank(o), o.seq))
        for owner in ranked:
            keys = [k for k, pos in sorted(self._members[owner].items(), key=lambda kv: -kv[1])
                    if k not in protected and k not in self._dead]
            out += keys
            if n is not None and len(out) >= n:
                return out[:n]
        return out

    def _rank(self, owner: _Req) -> float:
        """Larger goes first; a request still running (not folded) goes last."""
        if owner.row is None:
            return -math.inf
        if owner.chain == "superseded":
            return math.inf
        table, p, scale = owner.view
        waited = max(0.0, self.now_s - owner.finish_s)
        if self.readout.kind == "next_use":
            return next_use_s(table, p, scale, waited, self.readout.q)
        return -reuse_within(table, p, scale, waited, self.readout.horizon_s)


def _log1p(x: float) -> float:
    return math.log1p(max(0.0, x))
