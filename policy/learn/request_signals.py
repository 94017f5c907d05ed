"""Request signals, online: what an engine or gateway knows of each request when it decides.

:class:`SignalTracker` watches requests arrive (``observe``, before each is served) and keeps,
per request, the facts a cache policy may read **at a given time**: at arrival its prompt,
conversation chain, depth in the chain, the gap since the chain's previous request finished;
only once the request has finished (``arrival_s + e2e_latency_s``; at arrival when the trace
gives no latency) how it finished (:func:`finish_class`), its output length and latency.
:meth:`SignalTracker.features` returns NaN for what is not known yet, so no row can read the
future: a test replays a trace with its future changed and checks every row is unchanged.

Chains: requests of one conversation (``session_id``; a sub-agent's requests form their own
chain under the request that started it). Without session ids (Mooncake) a request continues
the chain of the request that last used its deepest already-seen block when it re-sends that
prompt whole (all but its partial last block): the next turn of a chat.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvtier.collector.events import FINISH_CLASSES, RequestRecord
from kvtier.collector.events import finish_class as _finish_class
FEATURES = (
    "log_prompt_tokens",   # ln(1 + prompt tokens)
    "subagent",            # 1 for a sub-agent's request
    "model_code",          # index of the model in the model's vocabulary (-1: unknown)
    "chain_depth",         # requests of its chain before it
    "log_prev_gap_s",      # ln(1 + seconds from the chain's previous finish to this arrival)
    "log_new_blocks",      # ln(1 + blocks past the previous chain request's prompt)
    "log_shared_blocks",   # ln(1 + blocks of the previous chain request's prompt)
    "log_chain_age_s",     # ln(1 + seconds since the chain's first request)
    "tail_fraction",       # the partial last block's share of a block (0: ends on a boundary)
    "prev_class",          # the previous chain request's finish class (index; -1: none)
    "log_prev_e2e_s",      # ln(1 + its latency)
    "log_prev_output",     # ln(1 + its output tokens)
    "finish_class",        # this request's finish class (index) - known once it finished
    "log_e2e_s",           # ln(1 + its latency)                  - known once it finished
    "log_output_tokens",   # ln(1 + its output tokens)            - known once it finished
)
ARRIVAL_FEATURES = len(FEATURES) - 3  # the leading columns known at arrival


def finish_class(record: RequestRecord) -> str:
    """How ``record`` ended, as one of :data:`FINISH_CLASSES` (``kvtier.collector.events``'s rule)."""
    return _finish_class(record.finish_status, record.stop_reason)


@dataclass
class _Request:
    arrival_s: float
    finish_s: float
    chain: int
    row: list            # FEATURES values; the finish columns filled in, shown after finish_s
    blocks: int


def _log1p(x: float) -> float:
    return math.log1p(max(0.0, x))


class SignalTracker:
    """Online request signals. ``observe(index, record, blocks)`` each request in arrival
    order, before it is served; ``models`` is the model vocabulary (names -> codes)."""

    def __init__(self, models: dict[str, int] | None = None) -> None:
        self.models = dict(models or {})
        self.requests: dict[int, _Request] = {}
        self.owner: dict[int, tuple[int, int]] = {}  # block -> (last request using it, position)
        self.successor: dict[int, int] = {}         # request -> next request of its chain
        self._chains: dict = {}                     # chain key -> chain id
        self._last_of_chain: dict[int, int] = {}    # chain id -> its latest request
        self._chain_start: dict[int, float] = {}
        self._depth: dict[int, int] = {}            # request -> depth in its chain

    def observe(self, index: int, record: RequestRecord, blocks) -> None:
        deepest = None
        if record.session_id is None:
            for h in blocks:
                if h not in self.owner:
                    break
                deepest = h
        self.observe_counted(index, record, len(blocks),
                             None if deepest is None else self.owner[deepest])
        for i, h in enumerate(blocks):
            self.owner[h] = (index, i)

    def observe_counted(self, index: int, record: RequestRecord, blocks: int,
                        deepest: tuple[int, int] | None) -> None:
        """:meth:`observe` with the walk over the blocks done by the caller: ``blocks`` is the
        request's block count, ``deepest`` the (request, position) that last used its
        deepest leading block already seen (``None``: none), read only without a session
        id. :attr:`owner` is then left to the caller."""
        now = record.arrival_s
        chain = self._chain_of(index, record, deepest)
        prev = self._last_of_chain.get(chain)
        if prev is not None:
            self.successor[prev] = index
        self._last_of_chain[chain] = index
        self._chain_start.setdefault(chain, now)
        p = self.requests.get(prev) if prev is not None else None
        depth = self._depth[prev] + 1 if p is not None else 0
        self._depth[index] = depth
        n = blocks
        block_tokens = record.block_size_tokens or 16
        tail = record.prompt_tokens % block_tokens
        row = [_log1p(record.prompt_tokens), float(record.request_type == "subagent"),
               float(self.models.get(record.model, -1)) if record.model else -1.0,
               float(depth), _log1p(now - p.finish_s) if p else -1.0,
               _log1p(n - p.blocks) if p else _log1p(n), _log1p(p.blocks) if p else 0.0,
               _log1p(now - self._chain_start[chain]), tail / block_tokens,
               p.row[12] if p else -1.0, p.row[13] if p else -1.0, p.row[14] if p else -1.0,
               float(FINISH_CLASSES.index(finish_class(record))),
               _log1p(record.e2e_latency_s or 0.0), _log1p(record.output_tokens or 0)]
        finish = now + (record.e2e_latency_s or 0.0)
        self.requests[index] = _Request(now, finish, chain, row, n)

    def _chain_of(self, index: int, record: RequestRecord, deepest: tuple[int, int] | None
                  ) -> int:
        if record.session_id is not None:
            key = (record.session_id,
                   record.parent_request_id if record.request_type == "subagent" else None)
        else:
            key = ("request", index)
            if deepest is not None:
                owner, position = deepest
                if position >= max(1, self.requests[owner].blocks - 2):
                    return self.requests[owner].chain  # the next turn of that chat
        return self._chains.setdefault(key, len(self._chains))

    # ---- what a policy reads at time ``now_s``

    def finished(self, index: int, now_s: float) -> bool:
        return now_s >= self.requests[index].finish_s

    def superseded(self, index: int) -> bool:
        """Whether a later request of its chain has arrived (its blocks not re-sent are dead)."""
        return index in self.successor

    def features(self, index: int, now_s: float) -> list[float]:
        """The :data:`FEATURES` row of request ``index`` as known at ``now_s`` (NaN: not yet)."""
        request = self.requests[index]
        if now_s >= request.finish_s:
            return list(request.row)
        return request.row[:ARRIVAL_FEATURES] + [math.nan] * (len(FEATURES) - ARRIVAL_FEATURES)

    def forget(self, index: int) -> None:
        """Drop a request nothing refers to any more (bounded state in an engine)."""
        self.requests.pop(index, None)
        self.successor.pop(index, None)
        self._depth.pop(index, None)
