"""The demo's two workloads, as the load probe replays them through the reference engine.

* **Agentic sessions** (the bundled WEKA-format slice, 16 Claude Code sessions): every turn
  re-sends the session's history, so reuse is high and sessions interleave on one node;
  the GPU tier holds a few sessions' histories, the rest must come from a CPU tier or be
  recomputed. Each session's prompts are coarsened 32-fold (ids are prefix-chained, so this
  is exact: one 16-token engine block stands for 2,048 trace tokens) to fit a tiny model.
* **Chat** (a slice of the bundled Mooncake conversation trace): reuse arrives minutes apart,
  far beyond a two-minute demo, so at this scale tiers find almost nothing to serve; it shows
  what a tier costs when it does not pay, and the rollback rule acting on that.

A workload's trace requests are what the load probe sends: each prompt keeps its first
``max_blocks`` trace blocks, one engine block of ``block_tokens`` tokens per trace block.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kvtier.collector.events import RequestRecord


@dataclass(frozen=True, slots=True)
class Workload:
    """A trace slice and the load shape it is replayed with (small enough for two cores)."""

    name: str
    title: str
    trace: Path
    requests: int
    coarsen: int = 1
    max_blocks: int = 128
    block_tokens: int = 16
    max_tokens: int = 8
    concurrency: tuple[int, ...] = (1, 2, 4)
    gpu_blocks: int = 160

    def __post_init__(self) -> None:
        if self.requests < len(self.concurrency):
            raise ValueError(f"{self.name}: requests must be >= one per concurrency level "
                             f"({len(self.concurrency)}), got {self.requests}")
        if self.coarsen < 1 or self.max_blocks < 1 or self.gpu_blocks < self.max_blocks:
            raise ValueError(f"{self.name}: need coarsen >= 1 and gpu_blocks ({self.gpu_blocks}) "
                             f">= max_blocks ({self.max_blocks}): one prompt must fit the GPU")

    @property
    def requests_per_level(self) -> int:
        return self.requests // len(self.concurrency)

    def records(self) -> list[RequestRecord]:
        """The trace requests the load probe sends (first ``requests``, coarsened)."""
        from kvtier.policy.learn.subset import limited
        from kvtier.policy.readers import open_trace

        reader = open_trace(self.trace)
        records = list(limited(reader.requests(), self.requests_per_level * len(self.concurrency),
                               self.coarsen))
        if not records:
            raise ValueError(f"{self.trace} holds no requests")
        return records

    def describe(self, records: list[RequestRecord]) -> str:
        sessions = len({r.session_id for r in records if r.session_id})
        scale = (f", prompts coarsened {self.coarsen}x (one {self.block_tokens}-token engine "
                 f"block per {records[0].block_size_tokens} trace tokens)" if self.coarsen > 1 else "")
        return (f"{len(records)} requests{f' of {sessions} sessions' if sessions else ''}{scale}, "
                f"at most {self.max_blocks} blocks per prompt, {self.max_tokens} output tokens, "
                f"concurrency {'/'.join(map(str, self.concurrency))}, GPU {self.gpu_blocks} blocks")


def agentic(requests: int | None = None, trace: Path | None = None) -> Workload:
    """The bundled agentic sessions (all 416 requests by default), or ``trace`` in their place."""
    from kvtier.traces import bundled_agentic_trace

    if trace is not None:
        return Workload("trace", f"the trace {trace}", trace, requests or 420, coarsen=1,
                        max_blocks=32, gpu_blocks=48)
    return Workload("agentic", "agentic coding sessions (kv-cache-tester traces, WEKA format)",
                    bundled_agentic_trace(), requests or 414, coarsen=32)


def chat(requests: int = 300) -> Workload:
    """The first requests of the bundled Mooncake conversation trace."""
    from kvtier.traces import bundled_trace

    return Workload("chat", "chat (Mooncake conversation trace)", bundled_trace(), requests,
                    max_blocks=32)
