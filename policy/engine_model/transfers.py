"""Promotions as bandwidth-limited transfer queues: when a request's promoted KV is on the GPU.

Two links, each one FIFO server: cold->CPU and CPU->GPU. A request's CPU promotion is one job
on the CPU->GPU link, started at its arrival; a cold promotion is a job on the cold->CPU link
started at arrival, then the request's whole promotion (CPU and cold tokens) one job on the
CPU->GPU link once it is in CPU. A job takes ``op_latency_s + bytes / bandwidth_bytes_per_s``
and waits for the jobs of requests that arrived before it (Lindley). The request may be scheduled once its last job
ends; a request that promotes nothing is ready at arrival.

An engine that copies promotions inside a step queues nothing: the request is ready at
arrival, and a step pays for its promotions instead (:meth:`TransferQueues.step_load_s`): the
step that admits and computes it (``in_step``: the reference engine), or a step of its own
that the scheduler admits it to load in before it computes (``load_step``: vLLM's offloading
connector; ``batch_scheduler.py``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np


@dataclass(frozen=True)
class TransferLink:
    """One copy path: a fixed cost per transfer job and a bandwidth."""

    bandwidth_bytes_per_s: float
    op_latency_s: float = 0.0

    def __post_init__(self) -> None:
        if not self.bandwidth_bytes_per_s > 0:
            raise ValueError(f"bandwidth_bytes_per_s must be > 0, got {self.bandwidth_bytes_per_s!r}")
        if not self.op_latency_s >= 0:
            raise ValueError(f"op_latency_s must be >= 0, got {self.op_latency_s!r}")

    def job_s(self, size_bytes: np.ndarray) -> np.ndarray:
        return self.op_latency_s + np.asarray(size_bytes, dtype=float) / self.bandwidth_bytes_per_s

    def to_dict(self) -> dict:
        return asdict(self)


class TransferQueues:
    """The two links' state: when each is free. Requests must come in arrival order."""

    def __init__(self, bytes_per_token: int, cpu_link: TransferLink, cold_link: TransferLink,
                 *, mode: str = "queued"):
        self.bytes_per_token, self.cpu_link, self.cold_link = bytes_per_token, cpu_link, cold_link
        self.mode = mode
        self.in_step = mode != "queued"  # a step pays for the copy; nothing waits on a link
        self.cpu_free_s = self.cold_free_s = float("-inf")

    def ready_at(self, arrival_s: float, cpu_tokens: int, cold_tokens: int) -> float:
        """When a request arriving now may be scheduled: its promoted KV on the GPU, or at
        once where the admitting step copies it."""
        if self.in_step:
            return arrival_s
        start = arrival_s
        if cold_tokens > 0:
            self.cold_free_s = start = (max(self.cold_free_s, arrival_s)
                                        + float(self.cold_link.job_s(cold_tokens * self.bytes_per_token)))
        if cpu_tokens + cold_tokens > 0:
            self.cpu_free_s = start = (max(self.cpu_free_s, start) + float(
                self.cpu_link.job_s((cpu_tokens + cold_tokens) * self.bytes_per_token)))
        return start

    def in_step_s(self, cpu_tokens: int, cold_tokens: int, loaded_byte_s: float) -> float:
        """What the step that admits and computes a request spends on its promotions
        (``in_step``; 0 otherwise): :meth:`step_load_s`."""
        if self.mode != "in_step":
            return 0.0
        return self.step_load_s(cpu_tokens, cold_tokens, loaded_byte_s)

    def step_load_s(self, cpu_tokens: int, cold_tokens: int, loaded_byte_s: float) -> float:
        """What a step spends loading a request's promotions: the cold blocks read over the
        cold link, then every promoted byte at ``loaded_byte_s`` (``StepCost.loaded_byte_s``)."""
        spent = loaded_byte_s * (cpu_tokens + cold_tokens) * self.bytes_per_token
        if cold_tokens:
            spent += float(self.cold_link.job_s(cold_tokens * self.bytes_per_token))
        return spent
