"""The in-engine next-use policy as a tier of the simulator's vLLM flow: its replay twin.

The twin is the plug-in's own order behind its LRU shadow
(:class:`~kvtier.probes.vllm.next_use_shadow.ShadowedNextUse`, reading the same
``{"model", "readout"}`` file) behind the request-scoped tier protocol the
vLLM flow drives: ``observe_request`` before each request, ``touch`` for the blocks the
request reuses from the CPU tier (its loads, and the GPU hits the tier holds of a request that
loaded nothing: vLLM's scheduler offers such a prompt from its first block, and the flow
does the same), ``evict`` to make room around the request's blocks, ``insert`` for each
store, ``finish`` when the request ends, ``remove`` when a block leaves.
Standard library only, like the plug-in; ``kvtier recommend --next-use-policy`` replays it.
"""

from __future__ import annotations

import functools
from collections.abc import Collection

from kvtier.collector.events import RequestRecord
from kvtier.probes.vllm.next_use_model import NextUseReader
from kvtier.probes.vllm.next_use_policy import NextUseState
from kvtier.probes.vllm.next_use_shadow import ShadowedNextUse

SIGNALS = ("session_id", "request_type", "parent_request_id", "model", "finish_status",
           "stop_reason", "e2e_latency_s", "output_tokens")


def signals_of(record: RequestRecord) -> dict:
    """The per-request signals a gateway passes to the plug-in (``kv_transfer_params``)."""
    signals = {"arrival_s": record.arrival_s, "prompt_tokens": record.prompt_tokens,
               "block_tokens": record.block_size_tokens or 16}
    for name in SIGNALS:
        value = getattr(record, name)
        if value is not None:
            signals[name] = value
    return signals


class NextUseTwin:
    """A request-scoped CPU tier of ``capacity_blocks`` over the plug-in's state for
    ``document`` (what the plug-in loads); ``decisions``: every eviction's victims."""

    name = "learned-next-use-vllm"
    reads_info = True       # positions come in the flow's block info
    request_scoped = True

    def __init__(self, capacity_blocks: int, document: dict) -> None:
        self.capacity_blocks = capacity_blocks
        self.state = ShadowedNextUse(
            functools.partial(NextUseState, NextUseReader(document)), capacity_blocks)
        self.decisions: list = []
        self.orders: list = []  # the order each eviction followed (``ShadowedNextUse``)
        self._request = None
        self._req_id = ""

    def observe_request(self, index: int, record: RequestRecord, blocks) -> None:
        self._req_id = f"replay-{index}"
        self._request = self.state.request(self._req_id, {"kvtier": signals_of(record)})

    def _position(self, info) -> int:
        return info.position if info is not None else len(self._request.used)

    def touch(self, key, info=None) -> None:
        if key not in self:
            raise KeyError(key)
        self.state.used(self._request, key, self._position(info), False)

    def insert(self, key, info=None) -> list:
        self.state.used(self._request, key, self._position(info), True)
        return []  # room is made by evict() first (vLLM's prepare_store)

    def finish(self) -> None:
        if self._request is None:
            return
        self.state.finished(self._req_id)
        self._request = None

    def __contains__(self, key) -> bool:
        return self.state.holds(key)

    def __len__(self) -> int:
        return self.state.resident()

    def remove(self, key) -> None:
        if key not in self:
            raise KeyError(key)
        self.state.forget(key)

    def evict(self, n: int, protected: Collection = ()) -> list | None:
        busy = set(protected)
        victims = self.state.order(n, lambda h: h in busy)
        if len(victims) < n:
            return None
        for key in victims:
            self.state.forget(key)
        self.decisions.append(tuple(victims))
        self.orders.append(self.state.following)
        return victims
