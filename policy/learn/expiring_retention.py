"""The decayed value as TensorRT-LLM priorities that expire.

Learned retention values a block at ``p * exp(-age / tau)`` (:mod:`kvtier.policy.learn.retention`):
the chance of reuse fades while the block goes unused. TensorRT-LLM cannot decay a priority,
but it can expire one: a token range's ``priority`` holds for ``duration_ms`` after the block
is first made available for reuse, then falls back to the default 35 (TensorRT-LLM
``executor.h``, ``KvCacheRetentionConfig``; ``batch_manager/evictionPolicy.cpp``:
``LRUEvictionPolicy::releaseBlock`` sets the expiry for a priority other than 35, ``refresh``
re-queues expired blocks at the default). kvtier's priorities are linear in the
value (:func:`kvtier.policy.recommend.value.priorities`: 100 is a block reused for sure), so a
priority ``P`` above the default decays to the default's value after
``tau * ln(P / 35)``: that is its ``duration_ms``. A priority at or below the default only
falls further under decay, so it never expires (an expiry would raise it back to 35), and
``tau`` = inf (no decay) expires nothing.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from kvtier.policy.writers.trtllm_retention import DEFAULT_RETENTION_PRIORITY, RetentionClass


def expiry_ms(priority: int, tau_s: float,
              default: int = DEFAULT_RETENTION_PRIORITY) -> int | None:
    """Milliseconds until ``priority``'s decayed value reaches ``default``'s (None: never)."""
    if not tau_s > 0:
        raise ValueError(f"tau_s must be > 0 (inf: no decay), got {tau_s!r}")
    if priority <= default or math.isinf(tau_s):
        return None
    return max(1, round(1000.0 * tau_s * math.log(priority / default)))


def expiring(classes: Sequence[RetentionClass], tau_s: float) -> tuple[RetentionClass, ...]:
    """``classes`` with each range's and decode's ``duration_ms`` set from ``tau_s``."""
    out = []
    for c in classes:
        ranges = tuple(dataclasses.replace(r, duration_ms=expiry_ms(r.priority, tau_s))
                       for r in c.token_ranges)
        out.append(dataclasses.replace(c, token_ranges=ranges,
                                       decode_duration_ms=expiry_ms(c.decode_priority, tau_s)))
    return tuple(out)
