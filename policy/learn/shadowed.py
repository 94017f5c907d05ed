"""A CPU tier that carries its own baseline: the learned order, yielding to LRU when behind.

Every candidate order (LRU first, then learned ones) runs twice: as a *ghost*, a directory of
block ids at the tier's capacity that is offered the same blocks as the real tier and holds
no data, and as an *order* over the blocks the real tier holds. Each request's prefix lookup
scores every ghost (the tokens it would have served past the GPU tier's prefix) and the real
tier; the scores decay with a window of ``window_requests`` requests. The real tier evicts in
the order of the candidate that leads, switching only when another leads it by more than
``margin`` of the window's prompt tokens (hysteresis). When the learned order falls behind LRU
on the traffic of the moment, the tier evicts as LRU does until the learned ghost is ahead
again — ARC's ghost lists and a hill-climbing tuner on the same idea.

A candidate may carry an admitter (the CPU tier's admission rule, chosen with its order:
:mod:`kvtier.policy.learn.pairs`): its ghost is offered only the blocks it admits, and the
real tier stores only what the admitter of the candidate it follows admits. So a filter that
turns bad on the traffic of the moment is dropped like a bad order: the baseline ghost
(plain LRU admitting every block) leads, and the tier follows it.

The GPU tier is not the CPU tier's to see, but in exclusive tiers it need not be: every
block of a request lands in the GPU, every GPU victim is offered here, so the set of blocks on
the GPU is known exactly from the two. It runs in the learned kernels (``Shadow``, over the core's
tiers): per block one byte per ghost and per order besides theirs; per request one prefix
walk per ghost.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kvtier.policy.learn.kernels import kernels
from kvtier.policy.sim.flows import compiled_admitter

WINDOW_REQUESTS = 500
MARGIN = 0.002  # of the window's prompt tokens: 0.2 points of hit ratio


@dataclass(frozen=True)
class ShadowStats:
    """What the shadowing did: requests served in each candidate's order, switches, and the
    lowest decayed lead of the real tier over the LRU ghost (hit ratio points over the window,
    after the first window)."""

    names: tuple[str, ...]
    requests_by_mode: tuple[int, ...]
    switches: int
    worst_lead_over_lru: float | None
    ghost_tokens: tuple[int, ...]   # tokens each ghost would have served, in all
    real_tokens: int                # tokens the real tier served, in all


class Shadowed:
    """A CPU tier (exclusive flows) whose ``candidates`` are (name, build) or (name, build,
    admitter) tuples, ``build`` making one of the core's tiers at a capacity (``None``:
    unbounded), ``admitter`` one of the simulator's admitters (``None``: every block); the
    first is the baseline and the starting order. ``signals``: the kernels' request signals
    the candidates share (they see each request first); ``block_tokens``: each request's block
    size as the scores count it (default: the trace's)."""

    name = "learned-safe"
    reads_info = False

    def __init__(self, capacity_blocks: int, candidates: Sequence[tuple[str, Callable]], *,
                 signals=None, block_tokens=None, window_requests: int = WINDOW_REQUESTS,
                 margin: float = MARGIN) -> None:
        if len(candidates) < 2:
            raise ValueError("need a baseline and at least one candidate order")
        if window_requests < 1 or not 0 <= margin < 1:
            raise ValueError(f"window_requests must be >= 1 and margin in [0, 1), got "
                             f"{window_requests!r} and {margin!r}")
        self.capacity_blocks = capacity_blocks
        self.names = tuple(c[0] for c in candidates)
        self._builds = [c[1] for c in candidates]
        self._admitters = [c[2] if len(c) > 2 else None for c in candidates]
        # chained admitters refuse a block whose parent no tier holds: the flow notes parents
        self.chained = any(getattr(a, "chained", False) for a in self._admitters)
        self._signals, self._block_tokens = signals, block_tokens
        self.window_requests, self.margin = window_requests, margin
        self._core = None

    def compiled_tier(self, interner):
        """The kernels' ``Shadow`` (one per replay: it holds the replay's state)."""
        if self._core is not None:
            raise ValueError("a shadowed tier serves one replay; build another")
        cap = self.capacity_blocks
        self._core = kernels().Shadow(cap, [b(cap) for b in self._builds],
                                   [b(None) for b in self._builds], self._block_tokens,
                                   self._signals, self.window_requests, self.margin,
                                   [compiled_admitter(a, interner) for a in self._admitters])
        return self._core

    def stats(self) -> ShadowStats:
        if self._core is None:
            raise ValueError("no replay has run this tier yet")
        by_mode, switches, worst, ghosts, real = self._core.stats()
        return ShadowStats(self.names, tuple(by_mode), switches,
                           None if worst is None else worst * 100, tuple(ghosts), real)
