"""What a prompt token costs this engine when a tier serves it and when it is recomputed.

The offloading verdict rests on hit *quality*: a CPU promotion saves time only when moving a
token's KV costs less than computing it again. From the latency model that would make the
promise:

* the engine model: a recomputed token costs ``prefill_token_s`` of a step; a promoted one
  ``cached_token_s`` (mapping what was found) plus ``loaded_byte_s`` for each of its KV bytes
  (the steps that load), plus, over the transfer links where loads are queued, the bytes
  over the link's bandwidth; and a promotion waits ``wait_s`` once per request (the step it
  loads in, vLLM; a link job's fixed cost where queued), whatever its size;
* the queue model: ``1 / prefill_tokens_per_s`` against the link's bytes over bandwidth, and
  its fixed cost per job.

Each figure carries its source (``measured`` from the engine's records, or ``default``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvtier.policy.latency.models import QueueModel, StepModel


@dataclass(frozen=True)
class TokenCosts:
    """Seconds per prompt token served by a CPU promotion and recomputed, the fixed wait a
    promoting request pays once, and where each came from."""

    promoted_s: float
    recomputed_s: float
    wait_s: float
    promoted_source: str
    recomputed_source: str

    @property
    def promotion_pays(self) -> bool:
        return self.promoted_s < self.recomputed_s

    def words(self) -> str:
        return (f"a promoted token costs {self.promoted_s * 1e6:.3g} us ({self.promoted_source}) "
                f"and a wait of {self.wait_s * 1e3:.3g} ms a request, a recomputed one "
                f"{self.recomputed_s * 1e6:.3g} us ({self.recomputed_source})")


def token_costs(model, promoted: Sequence = (), promoted_source: str = "measured",
                recomputed_source: str = "measured") -> TokenCosts | None:
    """The costs ``model`` (a :class:`StepModel` or :class:`QueueModel`) prices tokens at;
    ``None`` for another model. ``promoted``: (tokens promoted, tokens cached before them) of
    each request that promotes (the engine model prices a recomputed token by where it sits:
    attention makes a deep token dearer), else a token at position 0."""
    if isinstance(model, StepModel):
        p = model.params
        c, per_token = p.step_cost, p.kv_bytes_per_token
        recomputed = c.prefill_token_s
        tokens = sum(t for t, _ in promoted)
        if tokens:  # attention over each promoted token's context, averaged per token
            recomputed += c.attention_s * sum(t * (ctx + t / 2) for t, ctx in promoted) / tokens
        promoted = c.cached_token_s + c.loaded_byte_s * per_token
        wait = 0.0
        if p.limits.promotions == "queued":
            promoted += per_token / p.cpu_link.bandwidth_bytes_per_s
            wait = p.cpu_link.op_latency_s
        elif p.limits.promotions == "load_step":
            wait = c.overhead_s + c.decode_pass_s  # the step the request loads in
        return TokenCosts(promoted, recomputed, wait, promoted_source, recomputed_source)
    if isinstance(model, QueueModel):
        q = model.params
        per_token = q.model.bytes_per_token
        return TokenCosts(per_token / q.cpu_gpu_bandwidth_bytes_per_s.value,
                          1.0 / q.prefill_tokens_per_s.value, q.cpu_gpu_op_latency_s.value,
                          q.cpu_gpu_bandwidth_bytes_per_s.source, q.prefill_tokens_per_s.source)
    return None
