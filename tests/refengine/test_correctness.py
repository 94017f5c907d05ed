"""A request's greedy output is the same whether its prefix comes from a cache tier or is
recomputed: GPU hit, CPU promotion, cold promotion. And the cache is really used: corrupt
the cached bytes and the output changes."""

from __future__ import annotations

import pytest

from tests.refengine.conftest import BLOCK, prompt, run, run_until_idle, tiny_config

P = prompt(1)
CACHED_TOKENS = 3 * BLOCK  # 13-token prompt: 3 full blocks, the last token is always computed


@pytest.fixture
def recomputed(make_engine) -> list[int]:
    return run(make_engine(tiny_config(gpu_blocks=5)), "ref", P).output


def test_gpu_hit_gives_the_recomputed_output(make_engine, recomputed):
    engine = make_engine(tiny_config(gpu_blocks=10))
    first = run(engine, "first", P)
    again = run(engine, "again", P)
    assert first.served.gpu == 0 and again.served.gpu == CACHED_TOKENS
    assert again.output == first.output == recomputed


def test_cpu_promotion_gives_the_recomputed_output(make_engine, recomputed):
    engine = make_engine(tiny_config(gpu_blocks=5, cpu_blocks=20, config_id="cpu"))
    run(engine, "first", P)
    run(engine, "other", prompt(2))  # needs all 5 GPU slots: P's blocks move to CPU
    again = run(engine, "again", P)
    assert (again.served.gpu, again.served.cpu) == (0, CACHED_TOKENS)
    assert again.output == recomputed


def test_cold_promotion_gives_the_recomputed_output(make_engine, recomputed, tmp_path):
    engine = make_engine(tiny_config(tmp_path, gpu_blocks=5, cpu_blocks=5, cold_blocks=40))
    run(engine, "first", P)
    for i in range(2, 5):  # each pushes 5 blocks GPU -> CPU, and CPU's oldest to files
        run(engine, f"other-{i}", prompt(i))
    again = run(engine, "again", P)
    assert (again.served.gpu, again.served.cpu, again.served.cold) == (0, 0, CACHED_TOKENS)
    assert again.output == recomputed


def test_mixed_prefix_from_gpu_and_cpu(make_engine, recomputed):
    engine = make_engine(tiny_config(gpu_blocks=6, cpu_blocks=20))
    run(engine, "first", P)
    run(engine, "other", prompt(2))  # takes 5 of 6 slots: evicts P's oldest blocks first
    again = run(engine, "again", P)
    assert again.served.cpu > 0 and again.served.gpu + again.served.cpu == CACHED_TOKENS
    assert again.output == recomputed


def test_corrupted_cpu_blocks_change_the_output(make_engine, recomputed):
    """Guards the tests above: promoted KV is what attention reads."""
    engine = make_engine(tiny_config(gpu_blocks=5, cpu_blocks=20))
    run(engine, "first", P)
    run(engine, "other", prompt(2))
    engine.kv.cpu.data.normal_()
    again = run(engine, "again", P)
    assert again.served.cpu == CACHED_TOKENS
    assert again.output != recomputed


def test_decode_filled_blocks_are_reused(make_engine):
    """Blocks filled while generating are cached: the continuation prompt hits them."""
    engine = make_engine(tiny_config(gpu_blocks=20))
    first = run(engine, "first", P, max_tokens=8)
    follow = run(engine, "follow", P + first.output + [5])
    assert follow.served.gpu == 5 * BLOCK


def test_batched_decode_gives_each_request_its_solo_output(make_engine):
    """Requests of different lengths decoded together (padded, masked) match running alone."""
    from kvtier.refengine.sequence import Sequence

    prompts = [prompt(i, length) for i, length in ((1, 13), (2, 5), (3, 22), (4, 1))]
    solo = [run(make_engine(tiny_config(gpu_blocks=10)), f"solo{i}", p, max_tokens=6).output
            for i, p in enumerate(prompts)]
    engine = make_engine(tiny_config(gpu_blocks=40))
    seqs = [Sequence(f"b{i}", p, 6, 0.0) for i, p in enumerate(prompts)]
    for seq in seqs:
        engine.submit(seq)
    engine.step()
    assert len(engine.scheduler.running) == 4  # all admitted together: decoded as one batch
    run_until_idle(engine)
    assert [s.output for s in seqs] == solo
