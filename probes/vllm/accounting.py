"""Per-request accounting inside vLLM's scheduler: the tier split of each prompt, how the
request ended, its latencies and what the client said about it. Free of vLLM types: the
connector (``probes/vllm/connector.py``) calls one method per scheduler hook.

Where each field comes from (vLLM 0.32 and 0.33, scheduler side):

* tier split: the local GPU prefix hit (``num_computed_tokens`` given to
  ``get_num_new_matched_tokens``), the connector's external hit split by
  ``get_external_cache_hit_sources`` (host → CPU; disk, p2p → cold), both taken when the
  scheduler admits the request (``update_state_after_alloc``, where vLLM's own
  ``prefix_cache_hits``/``external_prefix_cache_hits`` counters are recorded); recomputed is
  the rest of the prompt. A request admitted again after a preemption keeps its first
  admission's split (vLLM's counters leave re-admissions out too); its GPU hits are recorded
  as block events again, since they happened.
* ``finish_status``/``stop_reason``: ``Request.status`` and ``Request.stop_reason`` at
  ``request_finished``. The engine core decides ``stopped`` (end of sequence, a stop token:
  ``stop_reason`` is its id), ``length`` and ``error``; a stop *string* is matched by vLLM's
  frontend, which then aborts the request in the core, so the core records ``aborted`` for it
  (the client sees ``stop``).
* ``ttft_s``: the step that produced the first output token (seen in the connector's per-step
  ``take_events``, right after the step's tokens are appended) minus ``Request.arrival_time``
  (set by the frontend on arrival); ``itl_s``: (finish − first token) / (output tokens − 1);
  ``e2e_latency_s``: finish − arrival. Engine-core times: they leave out the frontend's
  detokenisation and the HTTP response.
* ``handoff_s``: the scheduler's ``add_request`` (the connector's ``on_new_request``) minus
  ``Request.arrival_time``: the frontend's tokenising and hand-off to the engine core.
* ``session_id``, ``parent_request_id``, ``request_type``, ``turn``, ``tier_config_id``: the
  ``"kvtier"`` object in the request's ``kv_transfer_params`` (the OpenAI API's
  ``kv_transfer_params`` body field), ``session_id`` also from ``Request.session_id``.
* ``client_request_id``: the id the client sees (:func:`client_request_id`).
* ``fallback_reason``/``fallback_tokens``: the external tokens kvtier's guardrail recomputed
  instead of loading them at the admitting lookup, and why (``probes/vllm/tier_gate.py``);
  ``tier_config_id`` then says which tiers were paused at admission.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Callable

from kvtier.collector.block_kinds import block_hash_from_bytes
from kvtier.collector.events import Outcome, RequestRecord, Tier

_COLD_SOURCES = ("disk", "p2p")
# vLLM RequestStatus names -> the schema's finish_status (FINISHED_IGNORED: a prompt longer than
# the model allows, which vLLM's API reports as "length").
FINISH_STATUS_OF = {
    "FINISHED_STOPPED": "stopped", "FINISHED_LENGTH_CAPPED": "length",
    "FINISHED_IGNORED": "length", "FINISHED_ABORTED": "aborted", "FINISHED_ERROR": "error",
    "FINISHED_REPETITION": "stopped",
}
# vLLM's frontend makes each request's internal id unique (InputProcessor.assign_request_id,
# 0.32 and 0.33): f"{external_req_id}-{random_uuid():.8}", eight hex digits of a uuid4. Its
# completions API names each prompt of a request f"cmpl-{id}-{prompt index}" (the response is
# "cmpl-{id}", the index its choice's); the chat API uses "chatcmpl-{id}" as it is.
_ENGINE_SUFFIX = re.compile(r"-[0-9a-f]{8}\Z")
_PROMPT_INDEX = re.compile(r"\Acmpl-.+(-[0-9]+)\Z")
_TAG_TYPES = {"session_id": str, "parent_request_id": str, "request_type": str, "turn": int,
              "tier_config_id": str}


@dataclass
class _Request:
    arrival_s: float
    prompt_tokens: int
    block_hashes: tuple[int, ...] = ()
    gpu_tokens: int = 0
    cpu_tokens: int = 0
    cold_tokens: int = 0
    admitted: bool = False
    first_token_s: float | None = None
    handoff_s: float | None = None
    fallback: tuple = ()  # (reason, tokens): a tier's tokens recomputed instead of loaded
    tier_config: str | None = None  # in force at admission
    # (gpu tokens, sources, fallback) of the latest lookup
    match: tuple = field(default=(), repr=False)


def request_tags(kv_transfer_params, session_id=None) -> dict:
    """The client's tags for the record: the ``"kvtier"`` object of ``kv_transfer_params``
    (wrong-typed values are ignored: a client's mistake must not break the engine)."""
    tags = {}
    ours = kv_transfer_params.get("kvtier") if isinstance(kv_transfer_params, Mapping) else None
    if isinstance(ours, Mapping):
        for name, kind in _TAG_TYPES.items():
            value = ours.get(name)
            if isinstance(value, kind) and not isinstance(value, bool) and value != "":
                tags[name] = value
    if isinstance(session_id, str) and session_id:
        tags.setdefault("session_id", session_id)
    return tags


def client_request_id(request_id: str, external_id=None) -> str | None:
    """The id the client saw for the engine-core request ``request_id``: vLLM's own
    ``external_req_id`` when the request carries it, else ``request_id`` without the suffix
    vLLM's frontend appends (``chatcmpl-abc-9a25cf86`` -> ``chatcmpl-abc``), and for the
    completions API without the prompt index too (``cmpl-abc-0-9a25cf86`` -> ``cmpl-abc``);
    ``None`` for an id without that suffix (``VLLM_DISABLE_REQUEST_ID_RANDOMIZATION``)."""
    client = external_id if isinstance(external_id, str) and external_id else None
    if client is None and isinstance(request_id, str):
        match = _ENGINE_SUFFIX.search(request_id)
        client = request_id[:match.start()] if match and match.start() > 0 else None
    indexed = _PROMPT_INDEX.match(client) if client else None
    return client[:indexed.start(1)] if indexed else client


def _as_hash(value) -> int:
    return block_hash_from_bytes(bytes(value)) if isinstance(value, (bytes, bytearray)) else int(value)


class RequestTokenAccounting:
    """Block events and request records from the scheduler's view of each request.

    ``block_size_tokens`` is the hash block size. At most ``max_requests`` requests are
    tracked at once (further ones go unreported rather than grow without bound).
    """

    def __init__(self, recorder, block_size_tokens: int, *, model: str | None = None,
                 clock: Callable[[], float] = time.time, max_requests: int = 100_000):
        if block_size_tokens <= 0:
            raise ValueError(f"block_size_tokens must be > 0, got {block_size_tokens!r}")
        self.recorder, self.block_size_tokens, self.model = recorder, block_size_tokens, model
        self._clock = clock
        self._requests: dict[str, _Request] = {}
        self._awaiting_first: dict[str, object] = {}  # request id -> vLLM Request
        self._max_requests = max_requests

    def received(self, request_id: str, *, arrival_s: float, prompt_tokens: int) -> None:
        """The scheduler took the request in (``add_request``): its hand-off is over."""
        if request_id in self._requests or len(self._requests) >= self._max_requests:
            return
        state = self._requests[request_id] = _Request(arrival_s, prompt_tokens)
        state.handoff_s = max(0.0, self._clock() - arrival_s)

    def matched(self, request_id: str, *, arrival_s: float, prompt_tokens: int,
                gpu_tokens: int, sources: dict[str, int], fallback: tuple = ()) -> None:
        """The lookup's answer (it may be asked again before the request is admitted);
        ``fallback``: (reason, tokens) the tiers held but the guardrail recomputes."""
        state = self._requests.get(request_id)
        if state is None:
            if len(self._requests) >= self._max_requests:
                return
            state = self._requests[request_id] = _Request(arrival_s, prompt_tokens)
        state.match = (gpu_tokens, dict(sources), fallback)

    def admitted(self, request, request_id: str, external_tokens: int, block_hashes,
                 tier_config: str | None = None) -> None:
        """The scheduler allocated the request's blocks: its tier split is final. Records one
        ``GPU_HIT`` per GPU-cached block. ``request`` is kept to watch for its first token."""
        state = self._requests.get(request_id)
        if state is None or not state.match:
            return
        gpu_tokens, sources, fallback = state.match
        # vLLM calls update_state_after_alloc again when an async load has finished (with no
        # external tokens, no new lookup): only the first call after a lookup admits.
        state.match = ()
        cold = min(external_tokens, sum(n for s, n in sources.items() if s in _COLD_SOURCES))
        hashes = tuple(_as_hash(h) for h in block_hashes)
        if not state.admitted:  # a preempted request's re-admission keeps the first split
            state.block_hashes, state.gpu_tokens = hashes, gpu_tokens
            state.cpu_tokens, state.cold_tokens = external_tokens - cold, cold
            state.fallback, state.tier_config = fallback, tier_config
            state.admitted = True
        now = self._clock()
        parent = None
        for position, block_hash in enumerate(hashes[:gpu_tokens // self.block_size_tokens]):
            self.recorder.record(int(Outcome.GPU_HIT), block_hash, request_id=request_id,
                                 parent_hash=parent, position=position,
                                 tokens=self.block_size_tokens, tier_to=int(Tier.GPU), time_s=now)
            parent = block_hash
        if state.first_token_s is None:
            self._awaiting_first[request_id] = request

    def step(self, output_tokens_of: Callable[[object], int]) -> None:
        """Once per engine step, after its tokens are appended: note first tokens."""
        if not self._awaiting_first:
            return
        now = self._clock()
        done = [rid for rid, request in self._awaiting_first.items() if output_tokens_of(request) > 0]
        for request_id in done:
            del self._awaiting_first[request_id]
            state = self._requests.get(request_id)
            if state is not None and state.first_token_s is None:
                state.first_token_s = now

    def tier_config(self, request_id: str) -> str | None:
        """The tier configuration in force when the request was admitted (``None``: unknown)."""
        state = self._requests.get(request_id)
        return None if state is None else state.tier_config

    def finished(self, request_id: str, *, status: str | None, stop_reason=None,
                 output_tokens: int | None = None, tags: Mapping | None = None,
                 client_request_id: str | None = None) -> RequestRecord | None:
        """Record the request and return its record (``None`` if it was never admitted)."""
        self._awaiting_first.pop(request_id, None)
        state = self._requests.pop(request_id, None)
        if state is None or not state.admitted:
            return None
        now = self._clock()
        first = state.first_token_s
        if first is None and output_tokens:
            first = now  # the only token came in the finishing step
        itl = None
        if first is not None and output_tokens and output_tokens > 1:
            itl = max(0.0, now - first) / (output_tokens - 1)
        served = state.gpu_tokens + state.cpu_tokens + state.cold_tokens
        try:
            record = RequestRecord(
                request_id=request_id, arrival_s=state.arrival_s,
                prompt_tokens=state.prompt_tokens, output_tokens=output_tokens,
                block_hashes=state.block_hashes, block_size_tokens=self.block_size_tokens,
                gpu_hit_tokens=state.gpu_tokens, cpu_promotion_tokens=state.cpu_tokens,
                cold_promotion_tokens=state.cold_tokens,
                recomputed_tokens=max(0, state.prompt_tokens - served),
                ttft_s=None if first is None else max(0.0, first - state.arrival_s), itl_s=itl,
                e2e_latency_s=max(0.0, now - state.arrival_s),
                finish_status=FINISH_STATUS_OF.get(status),
                stop_reason=_stop_reason(status, stop_reason), model=self.model,
                client_request_id=client_request_id, handoff_s=state.handoff_s,
                fallback_reason=state.fallback[0] if state.fallback else None,
                fallback_tokens=state.fallback[1] if state.fallback else None,
                **dict(tags or {}))
        except (TypeError, ValueError):  # never break the engine: counted as a rejected call
            self.recorder.rejected_events += 1
            return None
        self.recorder.record_request(record)
        return record


def _stop_reason(status: str | None, stop_reason) -> str | None:
    if status == "FINISHED_REPETITION":
        return "repetition"
    if stop_reason is None or isinstance(stop_reason, bool):
        return None
    return str(stop_reason)
