"""From P(reuse in time) to a block's value and a 0-100 retention priority.

value = P(reuse before eviction) x (recompute cost - promotion cost), per byte the block
occupies, in seconds of prefill saved per byte held. The priority scale is TensorRT-LLM's
and Dynamo's (0..100): a full block that is certainly reused (P = 1) gets 100, values are
linear below it, and a block whose promotion costs more than recomputing it gets 0.
Priorities are quantised to ``step`` so that the classes in use are few and separated
(the TRT-LLM writer needs a threshold strictly between the classes kept and offloaded).
"""

from __future__ import annotations

import numpy as np

from kvtier.policy.cost import CostParams

PRIORITY_STEP = 10


def value_per_byte(p_reuse: np.ndarray, tokens: np.ndarray, params: CostParams) -> np.ndarray:
    """Seconds of prefill saved per byte held, expected over the reuse probability."""
    tokens = np.asarray(tokens, dtype=float)
    saved = np.array([params.recompute_s(t) - params.promotion_s(int(t), "cpu")
                      for t in tokens.tolist()]) if len(tokens) else np.zeros(0)
    size = np.maximum(tokens * params.model.bytes_per_token, 1.0)
    return np.asarray(p_reuse, dtype=float) * saved / size


def full_block_value(block_tokens: int, params: CostParams) -> float:
    """The value per byte of a full block reused for sure: the top of the scale."""
    return float(value_per_byte(np.ones(1), np.asarray([block_tokens]), params)[0])


def priorities(values: np.ndarray, top_value: float, step: int = PRIORITY_STEP) -> np.ndarray:
    """0..100 ints, multiples of ``step``; non-positive values map to 0."""
    if not 1 <= step <= 100 or 100 % step:
        raise ValueError(f"step must divide 100 (1, 2, 4, 5, 10, 20, 25, 50, 100), got {step!r}")
    if not top_value > 0:
        raise ValueError(f"top_value must be > 0 (recompute must cost more than a "
                         f"promotion), got {top_value!r}")
    scaled = np.clip(np.asarray(values, dtype=float) / top_value, 0.0, 1.0) * 100
    return (np.round(scaled / step) * step).astype(int)
