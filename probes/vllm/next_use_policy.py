"""kvtier's learned vLLM CPU-tier cache policy: evict the blocks whose conversation comes back last.

Load it with ``"eviction_policy": "KvtierNextUsePolicy", "cache_policy_module_path":
"kvtier.probes.vllm.next_use_policy"`` in ``kv_connector_extra_config`` (vLLM's out-of-tree
``CachePolicy`` hook, 0.32 and 0.33) and point ``KVTIER_NEXT_USE_MODEL`` at the JSON file
``kvtier recommend --next-use-policy`` writes (``{"model": ..., "readout": ...}``: tables
and trees, no pickle; read by ``probes/vllm/next_use_model.py``), or call :func:`configure`
in-process. Without a model it evicts the least recently
used request's blocks first. ``KVTIER_NEXT_USE_LOG`` names a file to append each eviction to.

Per request it reads what a gateway passes in ``kv_transfer_params["kvtier"]``: the session
(a conversation; sub-agents under ``parent_request_id``), ``request_type``, ``model``, and
``arrival_s`` on the gateway's clock (default: this process's monotonic clock), plus
``block_tokens``; how a request finished (and its prompt's length) comes from
:func:`note_finished` (kvtier's connector, ``probes/vllm/connector.py``, calls it with each
finished request's record) or the same parameters. The simulator replays this same order
(``probes/vllm/next_use_twin.py``; a test holds the replay to a serving engine's decisions):
dead blocks first (the chain
moved on without them), then the groups of blocks each request last used, by the model's
readout now (the chain that comes back last first), each deepest block first; the running
request's blocks last. That order runs behind an online LRU shadow
(:class:`ShadowedNextUse`): the tier evicts as LRU does while a ghost in the learned order
holds fewer of the recent requests' blocks than an LRU ghost, and in the learned order while
it holds more. State: one entry per resident block, one per request owning
any, one per recent chain (:data:`MAX_CHAINS`), one per block a store announced until it
lands; the shadow's two ghosts as many again. Per finished request: one pass over its blocks
and one prediction of each tree, each twice (the tier's order and the learned ghost's). Per
eviction call of ``n`` blocks over ``R`` owning requests: ``R`` readouts (two bisections of a
64-entry table each), a sort of ``R``, and a sort of each group taken from until ``n`` are
found. Imports only the standard library (and vLLM, when vLLM asks).
"""

from __future__ import annotations

import functools
import json
import math
import os
import time
from collections import OrderedDict, deque

from kvtier.collector import json_text
from kvtier.collector.events import FINISH_CLASSES, finish_class
from kvtier.probes.vllm.block_records import key_hash
from kvtier.probes.vllm.next_use_model import NextUseReader
from kvtier.probes.vllm.next_use_shadow import ShadowedNextUse

MODEL_ENV = "KVTIER_NEXT_USE_MODEL"
LOG_ENV = "KVTIER_NEXT_USE_LOG"  # append each eviction as a JSON line (an audit trail)
MAX_CHAINS = 65_536
_STATE: dict = {"model": None, "finished": {}}


def configure(model: dict | None) -> None:
    """Set (``None``: clear) the process's model: the ``{"model", "readout"}`` document."""
    _STATE["model"] = None if model is None else NextUseReader(model)


def note_finished(req_id: str, finish_status: str | None, stop_reason: str | None,
                  e2e_latency_s: float | None = None, output_tokens: int | None = None,
                  prompt_tokens: int | None = None) -> None:
    """How a request ended (the engine's connector calls this when it finishes)."""
    finished = _STATE["finished"]
    finished[req_id] = {"finish_status": finish_status, "stop_reason": stop_reason,
                        "e2e_latency_s": e2e_latency_s, "output_tokens": output_tokens,
                        "prompt_tokens": prompt_tokens}
    while len(finished) > MAX_CHAINS:
        finished.pop(next(iter(finished)))


def _model():
    path = os.environ.get(MODEL_ENV)
    if _STATE["model"] is None and path:
        try:
            with open(path, encoding="utf-8") as f:
                configure(json.load(f))
        except (OSError, ValueError, KeyError, TypeError, IndexError) as error:
            raise ValueError(f"{MODEL_ENV}={path}: not a kvtier next-use policy file "
                             f"({type(error).__name__}: {error}); write one with "
                             f"`kvtier recommend --next-use-policy`") from None
    return _STATE["model"]


def _log1p(x: float) -> float:
    return math.log1p(max(0.0, x))


class _Req:
    __slots__ = ("arrival_s", "blocks", "chain", "finish_s", "row", "seq", "signals", "used",
                 "view")

    def __init__(self, seq: int, signals: dict) -> None:
        self.seq, self.signals = seq, signals
        self.arrival_s = float(signals.get("arrival_s", time.monotonic()))
        self.used: dict = {}
        self.row = self.view = None
        self.blocks = 0
        self.chain = None
        self.finish_s = self.arrival_s


class NextUseState:
    """The policy's state and order, without vLLM (what the vLLM class drives)."""

    def __init__(self, model: NextUseReader | None) -> None:
        self.model = model
        self.now_s = 0.0
        self._seq = 0
        self._requests: dict = {}       # request id -> _Req, until it finishes
        self._owner: dict = {}
        self._members: dict = {}
        self._dead: OrderedDict = OrderedDict()
        self._chains: OrderedDict = OrderedDict()

    def request(self, req_id: str, params: dict | None) -> _Req:
        request = self._requests.get(req_id)
        if request is None:
            self._seq += 1
            signals = dict((params or {}).get("kvtier") or {})
            request = self._requests[req_id] = _Req(self._seq, signals)
            self.now_s = request.arrival_s
        return request

    def running(self, req_id: str) -> _Req | None:
        """``req_id``'s request while it runs (``None`` once it finished or if never seen)."""
        return self._requests.get(req_id)

    def used(self, request: _Req, key: int, position: int, stored: bool) -> None:
        request.used.setdefault(key, position)
        if stored:
            self._own(key, request, request.used[key])

    def _own(self, key: int, owner: _Req, position: int) -> None:
        old = self._owner.get(key)
        if old is not None:
            members = self._members[old]
            members.pop(key, None)
            if not members:
                del self._members[old]
        self._owner[key] = owner
        self._members.setdefault(owner, {})[key] = position

    def finished(self, req_id: str, folded: _Req | None = None) -> None:
        """The request ended (how: what :func:`note_finished` kept). ``folded``: the same
        request as another order over the same requests already folded it (the shadow's
        learned ghost takes the tier's row and readout view rather than working them out
        again from the fewer blocks it was offered)."""
        request = self._requests.pop(req_id, None)
        if request is None:
            return
        if folded is None:
            request.signals.update({k: v for k, v in _STATE["finished"].pop(req_id, {}).items()
                                    if v is not None})
            self._fold(request)
        else:
            self._chain(request, folded.chain)
            request.blocks, request.finish_s = folded.blocks, folded.finish_s
            request.row, request.view = folded.row, folded.view
        for key, position in request.used.items():
            if key in self._owner:
                self._own(key, request, position)
                if request.chain == "superseded" or (
                        self.model is not None and self.model.last_block_dead
                        and position == request.blocks - 1):
                    self._dead[key] = None
                else:
                    self._dead.pop(key, None)

    def _fold(self, request: _Req) -> None:
        s = request.signals
        request.blocks = max(request.used.values(), default=-1) + 1
        key = ((s["session_id"], s.get("parent_request_id")
                if s.get("request_type") == "subagent" else None)
               if s.get("session_id") is not None else ("request", request.seq))
        prev, start_s = self._chain(request, key)
        bt = int(s.get("block_tokens", 16))
        # the prompt's tokens when told (the connector, the gateway), else its full blocks'
        prompt = int(s.get("prompt_tokens") or request.blocks * bt)
        e2e = float(s.get("e2e_latency_s") or 0.0)
        request.finish_s = request.arrival_s + e2e
        cls = finish_class(s.get("finish_status"), s.get("stop_reason"))
        models = self.model.models if self.model is not None else {}
        name = s.get("model")
        request.row = [
            _log1p(prompt), float(s.get("request_type") == "subagent"),
            float(models.get(name, -1)) if name else -1.0,
            prev.row[3] + 1 if prev is not None else 0.0,
            _log1p(request.arrival_s - prev.finish_s) if prev else -1.0,
            _log1p(request.blocks - prev.blocks) if prev else _log1p(request.blocks),
            _log1p(prev.blocks) if prev else 0.0, _log1p(request.arrival_s - start_s),
            (prompt % bt) / bt,
            prev.row[12] if prev else -1.0, prev.row[13] if prev else -1.0,
            prev.row[14] if prev else -1.0, float(FINISH_CLASSES.index(cls)), _log1p(e2e),
            _log1p(float(s.get("output_tokens") or 0))]
        if self.model is not None:
            request.view = self.model.view(request.row)

    def _chain(self, request: _Req, key) -> tuple:
        """``request`` the latest of its chain ``key``; the one it supersedes (or ``None``)
        and when the chain began."""
        prev, start_s = self._chains.pop(key, (None, request.arrival_s))
        self._chains[key] = (request, start_s)
        if len(self._chains) > MAX_CHAINS:
            self._chains.popitem(last=False)
        if prev is not None:
            prev.chain = "superseded"
        request.chain = key
        return prev, start_s

    def holds(self, key: int) -> bool:
        """Whether ``key`` is a resident block the order knows (owned or orphaned)."""
        return key in self._owner or key in self._dead

    def resident(self) -> int:
        return len(self._owner) + sum(1 for k in self._dead if k not in self._owner)

    def orphan(self, key: int) -> None:
        """A resident block no request is known to own: evicted first."""
        self._dead[key] = None

    def forget(self, key: int) -> None:
        owner = self._owner.pop(key, None)
        self._dead.pop(key, None)
        if owner is not None:
            members = self._members[owner]
            members.pop(key, None)
            if not members:
                del self._members[owner]

    def order(self, n: int, skip) -> list:
        """The first ``n`` blocks to go, passing over ``skip(key)``."""
        out = [k for k in self._dead if not skip(k)]
        if len(out) >= n:
            return out[:n]
        for owner in sorted(self._members, key=lambda o: (-self._rank(o), o.seq)):
            members = self._members[owner]
            out += [k for k, _ in sorted(members.items(), key=lambda kv: -kv[1])
                    if not skip(k) and k not in self._dead]
            if len(out) >= n:
                return out[:n]
        return out

    def _rank(self, owner: _Req) -> float:
        if owner.row is None:
            return -math.inf   # still running: its blocks go last
        if owner.chain == "superseded":
            return math.inf
        if self.model is None:
            return -owner.seq  # no model: the least recently used request first
        return self.model.rank(owner.view, max(0.0, self.now_s - owner.finish_s))


def __getattr__(name: str):
    if name == "KvtierNextUsePolicy":
        return _policy_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@functools.cache
def _policy_class():
    from vllm.v1.kv_offload.cpu.policies.base import CachePolicy

    class KvtierNextUsePolicy(CachePolicy):
        """vLLM's CachePolicy over :class:`ShadowedNextUse`; ``decisions`` holds the latest
        evictions."""

        def __init__(self, cache_capacity: int):
            super().__init__(cache_capacity)
            self.state = ShadowedNextUse(functools.partial(NextUseState, _model()),
                                         cache_capacity)
            self.chunks: dict = {}
            self.storing: dict = {}  # vLLM key -> (request, position) announced, not inserted
            self.keys: dict = {}  # schema hash -> vLLM key
            self.decisions: deque = deque(maxlen=1024)  # the latest evictions
            self._log = os.environ.get(LOG_ENV)

        def _request(self, req_context):
            return self.state.request(req_context.req_id, req_context.kv_transfer_params)

        def _position(self, key, req_context, request) -> int:
            end = req_context.get_offload_key_position(key)
            bt = int(request.signals.get("block_tokens", 16))
            return end // bt - 1 if end is not None else len(request.used)

        def get(self, key):
            return self.chunks.get(key)

        def insert(self, key, chunk, *req_context) -> None:
            # vLLM 0.33 passes the storing request; 0.32 does not, but announced the key
            # through on_store_miss first (kept in ``storing`` until it lands or its request ends)
            self.chunks[key] = chunk
            self.keys[key_hash(key)] = key
            if req_context:
                request = self._request(req_context[0])
                position = self._position(key, req_context[0], request)
            else:
                request, position = self.storing.pop(key, (None, None))
                if request is None:  # never announced (a store racing a reset): goes first
                    self.state.orphan(key_hash(key))
                    return
            self.state.used(request, key_hash(key), position, True)

        def remove(self, key) -> None:
            self.chunks.pop(key, None)
            self.keys.pop(key_hash(key), None)
            self.state.forget(key_hash(key))

        def touch(self, keys, req_context) -> None:
            request = self._request(req_context)
            for key in keys:
                if key in self.chunks:
                    self.state.used(request, key_hash(key),
                                    self._position(key, req_context, request), False)

        def on_store_miss(self, keys, req_context) -> None:
            request = self._request(req_context)
            for key in keys:
                self.storing[key] = (request, self._position(key, req_context, request))

        def on_request_finished(self, key_groups, insertion_only_keys, reused_keys,
                                req_context) -> None:
            self.touch([k for group in key_groups for k in group if k in reused_keys],
                       req_context)
            for group in key_groups:
                for key in group:
                    self.storing.pop(key, None)
            self.state.finished(req_context.req_id)

        def evict(self, n, protected):
            if n == 0:
                return []
            by_hash, chunks = self.keys, self.chunks
            busy = {key_hash(k) for k in protected}
            skip = lambda h: h in busy or chunks[by_hash[h]].ref_cnt != 0  # pinned or writing
            victims = self.state.order(n, skip)
            if len(victims) < n:
                return None
            out = []
            for h in victims:
                key = by_hash[h]
                out.append((key, self.chunks.pop(key)))
                del self.keys[h]
                self.state.forget(h)
            self.decisions.append(tuple(victims))
            if self._log:
                with open(self._log, "a", encoding="utf-8") as f:
                    f.write(json_text.dumps({"now_s": self.state.now_s, "victims": victims,
                                             "order": self.state.following,
                                             "scores": self.state.scores}) + "\n")
            return out

        def clear(self) -> None:
            self.chunks.clear()
            self.keys.clear()
            self.storing.clear()
            self.state = ShadowedNextUse(functools.partial(NextUseState, self.state.model),
                                         self.cache_capacity)

    return KvtierNextUsePolicy
