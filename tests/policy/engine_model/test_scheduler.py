"""The batch scheduler and the replay on narrated scenarios, with step costs simple enough to
follow by hand (1 s a step, plus what the scenario adds)."""

from __future__ import annotations

import numpy as np
import pytest

from kvtier.policy.engine_model.batch_scheduler import SchedulerLimits
from kvtier.policy.engine_model.params import EngineModelParams
from kvtier.policy.engine_model.step_cost import StepCost
from kvtier.policy.engine_model.step_replay import EngineRequests, replay


def requests(*rows) -> EngineRequests:
    """Rows of (arrival_s, prompt, output, gpu, cpu, cold, recompute)."""
    a = np.array(rows, dtype=float).reshape(-1, 7)
    ints = [a[:, i].astype(np.int64) for i in range(1, 7)]
    return EngineRequests(a[:, 0], *ints)


def params(step_cost=StepCost(overhead_s=1.0), **limits) -> EngineModelParams:
    return EngineModelParams(step_cost=step_cost, limits=SchedulerLimits(**limits))


def test_two_requests_arriving_together_share_their_steps():
    # both prompts in step 1 (first tokens at 1 s), then two decode steps for both: 3 steps
    result = replay(requests((0, 10, 3, 0, 0, 0, 10), (0, 10, 3, 0, 0, 0, 10)), params())
    assert result.steps == 3
    assert result.ttft_s.tolist() == [1.0, 1.0]
    assert result.e2e_s.tolist() == [3.0, 3.0]
    assert result.itl_s.tolist() == [1.0, 1.0]


def test_one_running_slot_makes_the_second_request_wait_for_the_first():
    result = replay(requests((0, 10, 3, 0, 0, 0, 10), (0, 10, 3, 0, 0, 0, 10)), params(max_running=1))
    assert result.ttft_s.tolist() == [1.0, 4.0]  # starts after the first's three steps
    assert result.steps == 6


def test_a_fully_cached_prompt_still_takes_one_step():
    cost = StepCost(overhead_s=0.010, prefill_token_s=0.001)
    result = replay(requests((0, 64, 1, 64, 0, 0, 0)), params(cost))
    assert result.steps == 1
    assert result.ttft_s[0] == pytest.approx(0.011)  # the last prompt token is computed


def test_a_long_prompt_is_chunked_by_the_token_budget():
    cost = StepCost(overhead_s=1.0, prefill_token_s=0.01)
    result = replay(requests((0, 250, 1, 0, 0, 0, 250)),
                    params(cost, token_budget=100, chunked_prefill=True))
    assert result.steps == 3  # 100 + 100 + 50 tokens
    assert result.ttft_s[0] == pytest.approx(3 * 1.0 + 250 * 0.01)


def test_without_chunking_a_prompt_over_what_is_left_waits_for_a_step_with_room():
    # request 0 decodes (1 token of a 100-token budget); request 1's 150-token prompt does
    # not fit beside it, so it waits until request 0 is done, then runs alone
    result = replay(requests((0, 10, 3, 0, 0, 0, 10), (0.5, 150, 1, 0, 0, 0, 150)),
                    params(token_budget=100))
    assert result.e2e_s[0] == 3.0
    assert result.ttft_s[1] == pytest.approx(4.0 - 0.5)


def test_decoding_requests_slow_as_context_grows():
    cost = StepCost(overhead_s=1.0, decode_context_s=0.01)
    result = replay(requests((0, 100, 3, 0, 0, 0, 100)), params(cost))
    # prefill step 1 s; decodes at context 101 and 102
    assert result.e2e_s[0] == pytest.approx(1.0 + (1.0 + 1.01) + (1.0 + 1.02))


def test_a_request_arriving_during_a_decode_run_joins_at_the_next_step():
    result = replay(requests((0, 10, 10, 0, 0, 0, 10), (2.5, 10, 1, 0, 0, 0, 10)), params())
    # steps end at 1, 2, 3, ...; the second is seen at 3 and prefilled in the step ending at 4
    assert result.ttft_s[1] == pytest.approx(4.0 - 2.5)
    assert result.e2e_s[0] == 10.0  # the shared step decoded it too


def test_a_thousand_requests_at_load_all_finish():
    rng = np.random.default_rng(3)
    n = 1000
    prompt = rng.integers(10, 2000, n)
    rows = np.column_stack([np.cumsum(rng.exponential(0.02, n)), prompt, rng.integers(1, 50, n),
                            prompt // 2, np.zeros(n), np.zeros(n), prompt - prompt // 2])
    cost = StepCost(0.002, 1e-5, 1e-4, 1e-9, 1e-4, 1e-7)
    result = replay(requests(*rows), params(cost, max_running=32, token_budget=512, chunked_prefill=True))
    assert np.isfinite(result.e2e_s).all() and (result.ttft_s > 0).all()
    assert (result.e2e_s >= result.ttft_s).all()


def test_an_engine_that_samples_after_each_prefill_gives_the_first_token_mid_step():
    # one step: 1 s overhead, then A's prefill (1 s), then B's (2 s)
    cost = StepCost(overhead_s=1.0, prefill_token_s=0.1, decode_request_s=0.5)
    rows = ((0, 10, 1, 0, 0, 0, 10), (0, 20, 1, 0, 0, 0, 20))
    at_end = replay(requests(*rows), params(cost))
    own = replay(requests(*rows), params(cost, first_token="own_prefill"))
    assert at_end.ttft_s.tolist() == pytest.approx([4.0, 4.0])
    assert own.ttft_s.tolist() == pytest.approx([2.0, 4.0])


def test_a_prompt_joining_a_decoding_batch_does_not_wait_for_the_decode_pass():
    # A prefills alone (0-2), then decodes in steps of 1 s overhead + 4 s decode pass; B
    # arrives at 3 and joins the step that starts at 7: its prefill (1 s) runs after the
    # overhead and before the decode pass, so its first token is out at 9, not at 13
    cost = StepCost(overhead_s=1.0, prefill_token_s=0.1, decode_pass_s=4.0)
    rows = ((0, 10, 4, 0, 0, 0, 10), (3, 10, 2, 0, 0, 0, 10))
    own = replay(requests(*rows), params(cost, first_token="own_prefill"))
    at_end = replay(requests(*rows), params(cost))
    assert own.ttft_s.tolist() == pytest.approx([2.0, 6.0])
    assert at_end.ttft_s.tolist() == pytest.approx([2.0, 10.0])


def test_a_slow_step_stretches_its_work_so_a_first_prefill_sees_its_share():
    # one step: 1 s overhead, A's prefill 1 s, B's 2 s: 4 s of work, 4 s of noise doubles it
    cost = StepCost(overhead_s=1.0, prefill_token_s=0.1)
    rows = ((0, 10, 1, 0, 0, 0, 10), (0, 20, 1, 0, 0, 0, 20))
    slow = EngineModelParams(cost, SchedulerLimits(first_token="own_prefill"), step_noise_s=(4.0, 4.0))
    assert replay(requests(*rows), slow).ttft_s.tolist() == pytest.approx([4.0, 8.0])


def test_a_request_waits_while_the_running_requests_hold_the_gpu_kv():
    # 10 blocks of 16 tokens; A and B each reserve 6 (80 prompt + 3 output tokens): B waits
    # for A to finish though max_running would let both run, then runs alone
    rows = ((0, 80, 3, 0, 0, 0, 80), (0, 80, 3, 0, 0, 0, 80))
    roomy = replay(requests(*rows), params(first_token="own_prefill"))
    tight = replay(requests(*rows), params(first_token="own_prefill", kv_blocks=10, block_tokens=16))
    assert roomy.ttft_s.tolist() == [1.0, 1.0]
    assert tight.ttft_s.tolist() == [1.0, 4.0]  # after A's three steps
    alone = replay(requests((0, 400, 2, 0, 0, 0, 400)), params(kv_blocks=10))
    assert alone.ttft_s.tolist() == [1.0]  # larger than the GPU: it still runs, alone


def test_prompt_blocks_the_running_requests_hold_count_once():
    # A and B are two turns of one session sent together: the same 5 prompt blocks, then an
    # output block each. Counted in full (12 blocks) they overflow 10; shared, they take 7
    from dataclasses import replace

    rows = ((0, 80, 3, 0, 0, 0, 80), (0, 80, 3, 0, 0, 0, 80))
    limits = dict(first_token="own_prefill", kv_blocks=10, block_tokens=16)
    shared = replace(requests(*rows), block_hashes=((1, 2, 3, 4, 5), (1, 2, 3, 4, 5)))
    assert replay(shared, params(**limits)).ttft_s.tolist() == [1.0, 1.0]
    other = replace(requests(*rows), block_hashes=((1, 2, 3, 4, 5), (6, 7, 8, 9, 10)))
    assert replay(other, params(**limits)).ttft_s.tolist() == [1.0, 4.0]
    # a third turn after both ended finds the whole capacity free again
    three = replace(requests(*rows, (10, 150, 1, 0, 0, 0, 150)),
                    block_hashes=((1, 2, 3, 4, 5), (1, 2, 3, 4, 5), tuple(range(20, 30))))
    assert replay(three, params(**limits)).ttft_s.tolist() == [1.0, 1.0, 1.0]


def test_a_request_maps_what_it_found_cached_when_it_starts():
    cost = StepCost(overhead_s=0.010, cached_token_s=0.001)
    result = replay(requests((0, 64, 2, 48, 0, 0, 16)), params(cost, first_token="own_prefill"))
    assert result.ttft_s[0] == pytest.approx(0.010 + 48 * 0.001)  # its 48 cached tokens
    assert result.e2e_s[0] == pytest.approx(0.010 + 48 * 0.001 + 0.010)  # charged once


def test_kv_capacity_must_be_a_positive_block_count():
    with pytest.raises(ValueError, match="kv_blocks"):
        SchedulerLimits(kv_blocks=0)
    with pytest.raises(ValueError, match="block_tokens"):
        SchedulerLimits(block_tokens=0)
