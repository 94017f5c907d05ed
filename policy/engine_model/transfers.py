"""Promotions as bandwidth-limited transfer queues: when a request's promoted KV is on the GPU.

Two links, each one FIFO server: cold->CPU and CPU->GPU. A request's CPU promotion is one job
on the CPU->GPU link, started at its arrival; a cold promotion is a job on the cold->CPU link
started at arrival, then the request's whole promotion (CPU and cold tokens) one job on the
CPU->GPU link once it is in CPU. A job takes ``op_latency_s + bytes / bandwidth_bytes_per_s``
and waits for the jobs ahead of it (Lindley). The request may be scheduled once its last job
ends; a request that promotes nothing is ready at arrival.
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


def fifo_done_s(start_s: np.ndarray, service_s: np.ndarray) -> np.ndarray:
    """When each job ends on one FIFO server, jobs served in order of ``start_s`` (stable)."""
    done = np.empty(len(start_s))
    free_at = -np.inf
    for i in np.argsort(start_s, kind="stable").tolist():
        free_at = max(free_at, start_s[i]) + service_s[i]
        done[i] = free_at
    return done


def ready_s(arrival_s: np.ndarray, cpu_tokens: np.ndarray, cold_tokens: np.ndarray,
            bytes_per_token: int, cpu_link: TransferLink, cold_link: TransferLink) -> np.ndarray:
    """When each request's promoted KV is on the GPU (its arrival when it promotes nothing)."""
    arrival = np.asarray(arrival_s, dtype=float)
    cpu, cold = np.asarray(cpu_tokens, dtype=float), np.asarray(cold_tokens, dtype=float)
    ready = arrival.copy()
    from_cold = np.flatnonzero(cold > 0)
    gpu_start = arrival.copy()
    if len(from_cold):
        gpu_start[from_cold] = fifo_done_s(arrival[from_cold],
                                           cold_link.job_s(cold[from_cold] * bytes_per_token))
    moving = np.flatnonzero(cpu + cold > 0)
    if len(moving):
        ready[moving] = fifo_done_s(gpu_start[moving],
                                    cpu_link.job_s((cpu + cold)[moving] * bytes_per_token))
    return ready
