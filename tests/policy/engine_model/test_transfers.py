"""Promotions move over bandwidth-limited FIFO links before a request's first step, or cost
the step that admits it where the engine copies them there."""

from __future__ import annotations

import numpy as np
import pytest

from kvtier.policy.engine_model.batch_scheduler import SchedulerLimits
from kvtier.policy.engine_model.params import EngineModelParams
from kvtier.policy.engine_model.step_cost import StepCost
from kvtier.policy.engine_model.step_replay import replay
from kvtier.policy.engine_model.transfers import TransferLink, TransferQueues
from tests.policy.engine_model.test_scheduler import requests

LINKS = dict(cpu_link=TransferLink(1e6, 0.0), cold_link=TransferLink(1e5, 0.1), kv_bytes_per_token=1000)


def ready_s(arrival_s: np.ndarray, cpu_tokens: np.ndarray, cold_tokens: np.ndarray,
            bytes_per_token: int, cpu_link: TransferLink, cold_link: TransferLink) -> np.ndarray:
    """When each request's promoted KV is on the GPU (its arrival when it promotes nothing),
    the requests taken in arrival order."""
    queues = TransferQueues(bytes_per_token, cpu_link, cold_link)
    arrival = np.asarray(arrival_s, dtype=float)
    ready = np.empty(len(arrival))
    for i in np.argsort(arrival, kind="stable").tolist():
        ready[i] = queues.ready_at(arrival[i], int(cpu_tokens[i]), int(cold_tokens[i]))
    return ready


def test_a_promotion_heavy_request_waits_for_its_transfer():
    # 2,000 CPU tokens x 1,000 bytes over 1 MB/s: 2 s on the link before its one step
    params = EngineModelParams(StepCost(overhead_s=0.5), SchedulerLimits(), **LINKS)
    result = replay(requests((0, 2010, 1, 0, 2000, 0, 10), (0, 10, 1, 0, 0, 0, 10)), params)
    assert result.ttft_s[0] == pytest.approx(2.5)
    assert result.ttft_s[1] == pytest.approx(0.5)  # nothing to move: not held up


def test_transfers_queue_behind_each_other_on_one_link():
    ready = ready_s(np.zeros(3), np.array([1000, 1000, 0]), np.zeros(3), 1000,
                    LINKS["cpu_link"], LINKS["cold_link"])
    assert ready.tolist() == pytest.approx([1.0, 2.0, 0.0])


def test_a_cold_promotion_is_staged_through_cpu():
    # cold->CPU: 0.1 s + 100,000 B / 100 kB/s = 1.1 s; then CPU->GPU 0.1 s for all 100 tokens
    ready = ready_s(np.array([5.0]), np.array([0]), np.array([100]), 1000,
                    LINKS["cpu_link"], LINKS["cold_link"])
    assert ready[0] == pytest.approx(5.0 + 1.1 + 0.1)


def test_promotions_wait_on_the_link_or_cost_the_admitting_step():
    # 64 CPU-tier tokens of 1 KiB: queued, the link takes 1 s before the request is scheduled;
    # in the step, that step costs 64 KiB x loaded_byte_s instead (0.5 s), and no link wait
    from dataclasses import replace

    cost = StepCost(overhead_s=1.0, loaded_byte_s=0.5 / 65536)
    row = (0, 80, 1, 0, 64, 0, 16)
    link = TransferLink(65536.0, 0.0)
    queued = EngineModelParams(cost, SchedulerLimits(), cpu_link=link, kv_bytes_per_token=1024)
    in_step = EngineModelParams(cost, SchedulerLimits(promotions="in_step"), cpu_link=link,
                                kv_bytes_per_token=1024)
    assert replay(requests(row), queued).ttft_s.tolist() == pytest.approx([2.0])
    assert replay(requests(row), in_step).ttft_s.tolist() == pytest.approx([1.5])
    # cold blocks are read from their files in that step too: the cold link's time, then the copy
    cold = replace(in_step, cold_link=TransferLink(16384.0, 0.25))
    assert replay(requests((0, 80, 1, 0, 0, 64, 16)), cold).ttft_s.tolist() == pytest.approx([1.0 + 0.5 + 4.25])
    with pytest.raises(ValueError, match="promotions must be one of"):
        SchedulerLimits(promotions="later")
