"""`kvtier evaluate`: its JSON, the time split, coarsened blocks."""

from __future__ import annotations

import argparse
import json

import pytest

from kvtier.errors import KvtierError
from kvtier.verbs import evaluate
from kvtier.policy.learn.compare import compare
from kvtier.policy.learn.split import Split
from kvtier.policy.learn.replay import Tiers
from kvtier.policy.learn.subset import coarsen, limited
from tests.policy.learn.synthetic import conversations, record

KEYS = ("policy", "token_hit_ratio", "gpu_hit_tokens", "cpu_promotion_tokens",
        "cold_promotion_tokens", "recompute_tokens", "ttft_p50_s", "ttft_p95_s", "ttft_p99_s")


def write_mooncake(path, records):
    lines = [{"timestamp": int(r.arrival_s * 1000), "input_length": r.prompt_tokens,
              "output_length": 8, "hash_ids": list(r.block_hashes)} for r in records]
    path.write_text("".join(json.dumps(o) + "\n" for o in lines))
    return path


def run_verb(argv, capsys):
    parser = argparse.ArgumentParser()
    evaluate.add_arguments(parser)
    assert evaluate.run(parser.parse_args(argv)) == 0
    return capsys.readouterr().out


@pytest.fixture
def trace(tmp_path):
    return write_mooncake(tmp_path / "t.jsonl", conversations(900, seed=5, block_tokens=512))


def test_evaluate_json_has_one_row_per_policy_in_order(trace, capsys):
    out = json.loads(run_verb(["--trace", str(trace), "--gpu-tokens", str(30 * 512),
                               "--cpu-tokens", str(200 * 512), "--policies",
                               "lru,arc,s3fifo,learned,belady", "--json"], capsys))
    rows = out["policies"]
    assert [r["policy"] for r in rows] == ["lru", "arc", "s3fifo", "learned", "belady"]
    for r in rows:
        assert all(k in r for k in KEYS)
        assert (r["gpu_hit_tokens"] + r["cpu_promotion_tokens"] + r["cold_promotion_tokens"]
                + r["recompute_tokens"]) == r["prompt_tokens"]
    by = {r["policy"]: r for r in rows}
    assert by["belady"]["token_hit_ratio"] > by["lru"]["token_hit_ratio"]
    assert by["belady"]["gap_closed"] == 1.0 and by["lru"]["gap_closed"] == 0.0
    assert out["train_requests"] + out["evaluated_requests"] == 900


def test_evaluate_text_and_bad_policy(trace, capsys):
    text = run_verb(["--trace", str(trace), "--gpu-tokens", "15360", "--cpu-tokens", "51200",
                     "--policies", "lru,belady"], capsys)
    assert "lru" in text and "belady" in text and "gap closed" in text
    parser = argparse.ArgumentParser()
    evaluate.add_arguments(parser)
    with pytest.raises(KvtierError, match="allowed: lru"):
        evaluate.run(parser.parse_args(["--trace", str(trace), "--gpu-tokens", "1k",
                                        "--cpu-tokens", "1k", "--policies", "lru,magic"]))


def test_a_separate_training_trace_is_evaluated_whole(tmp_path):
    records, train = conversations(500, seed=6), conversations(500, seed=7)
    out = compare(Split.separate(records, train), Tiers(30, 150), ["lru", "learned"])
    assert out["evaluated_requests"] == 500 and out["train_requests"] == 500
    assert out["policies"][1]["gap_closed"] is None  # no Belady row, no gap


def test_split_by_time_trains_on_the_earliest_share():
    records = [record(i, [1, i + 10], t=i * 2.0) for i in range(10)]
    split = Split.by_time(records, 0.5)
    assert split.count_from == 5 and split.train == tuple(records[:5])
    with pytest.raises(ValueError, match="train_fraction"):
        Split.by_time(records, 1.0)


def test_coarsen_keeps_prefix_identity():
    r = record(0, [1, 2, 3, 4, 5], tokens=64)
    c = coarsen(r, 2)
    assert c.block_hashes == (2, 4, 5) and c.block_size_tokens == 128
    assert coarsen(record(1, [1, 2, 3, 4], tokens=64), 2).block_hashes == (2, 4)
    assert [x.request_id for x in limited([r, r, r], max_requests=2)] == ["r0", "r0"]
    with pytest.raises(ValueError, match="factor"):
        coarsen(r, 0)


def test_libcachesim_rows_run_on_the_same_block_stream(trace, capsys):
    pytest.importorskip("libcachesim")
    out = json.loads(run_verb(["--trace", str(trace), "--gpu-tokens", str(30 * 512),
                               "--cpu-tokens", str(200 * 512), "--policies", "lru,belady",
                               "--libcachesim", "all", "--json"], capsys))
    ours = {r["policy"]: r for r in out["policies"]}
    theirs = {r["policy"]: r for r in out["libcachesim"]}
    assert list(theirs) == ["lcs:lru", "lcs:lru+bloom"]
    # two exclusive LRU tiers are one LRU of their combined size: both count the same hits
    assert theirs["lcs:lru"]["token_hit_ratio"] == pytest.approx(ours["lru"]["token_hit_ratio"])
    assert theirs["lcs:lru"]["gap_closed"] == pytest.approx(0.0, abs=1e-12)
    assert theirs["lcs:lru"]["prompt_tokens"] == ours["lru"]["prompt_tokens"]
    assert theirs["lcs:lru"]["capacity_blocks"] == 230
    # the admissioner is wired in: admitting on the second request keeps the conversations'
    # one-shot blocks out and serves more than plain LRU of the same size
    assert theirs["lcs:lru+bloom"]["token_hit_ratio"] > theirs["lcs:lru"]["token_hit_ratio"]


def test_the_gpu_sighting_row_is_the_two_tier_form_of_libcachesims_bloom_row(trace, capsys):
    pytest.importorskip("libcachesim")
    out = json.loads(run_verb(["--trace", str(trace), "--gpu-tokens", str(100 * 512),
                               "--cpu-tokens", str(100 * 512), "--policies",
                               "lru,sightings-gpu", "--libcachesim", "lcs:lru+bloom", "--json"],
                              capsys))
    ours = {r["policy"]: r for r in out["policies"]}
    bloom = out["libcachesim"][0]
    # one cache of both tiers' size admitting a block on its second request serves what two
    # tiers each keeping a new block from its second request serve (a request's fresh blocks
    # still take GPU slots while it runs, which one cache has no notion of: hence not exact)
    assert ours["sightings-gpu"]["token_hit_ratio"] == pytest.approx(
        bloom["token_hit_ratio"], abs=0.002)
    assert ours["sightings-gpu"]["token_hit_ratio"] > ours["lru"]["token_hit_ratio"] + 0.02
    # the one-shot blocks never reach the CPU tier
    assert ours["sightings-gpu"]["cpu_stores_total"] < ours["lru"]["cpu_stores_total"] / 2


def test_libcachesim_names_are_checked(trace):
    parser = argparse.ArgumentParser()
    evaluate.add_arguments(parser)
    with pytest.raises(KvtierError, match="--libcachesim: unknown lcs:magic; allowed: lcs:lru"):
        evaluate.run(parser.parse_args(["--trace", str(trace), "--gpu-tokens", "15360",
                                        "--cpu-tokens", "51200", "--policies", "lru",
                                        "--libcachesim", "lcs:magic"]))


def test_split_by_requests_trains_on_the_earliest_requests_whatever_their_times():
    # a long thin tail: nine requests in the first second, one a day later
    records = [record(i, [1, i + 10], t=i * 0.1) for i in range(9)]
    records.append(record(9, [1, 99], t=86400.0))
    assert Split.by_time(records, 0.5).count_from == 9  # the time split evaluates one request
    split = Split.by_count(records, 0.5)
    assert split.count_from == 5 and split.train == tuple(records[:5])
    with pytest.raises(ValueError, match="train_fraction"):
        Split.by_count(records, 0.0)


def test_evaluate_split_option(trace, capsys):
    out = json.loads(run_verb(["--trace", str(trace), "--gpu-tokens", "15360", "--cpu-tokens",
                               "51200", "--policies", "lru", "--split", "requests",
                               "--train-fraction", "0.25", "--json"], capsys))
    assert out["train_requests"] == 225 and out["evaluated_requests"] == 675


def test_oracle_reused_admits_exactly_the_blocks_referenced_again():
    from kvtier.policy.learn.baselines.oracle_reused import ReusedLaterAdmitter

    records = [record(0, [1, 2]), record(1, [3]), record(2, [1, 4])]
    oracle = ReusedLaterAdmitter(records)
    oracle.request_index = 1
    assert oracle.admit(1, None)          # block 1 comes back in request 2
    assert not oracle.admit(2, None)      # block 2 never does
    assert not oracle.admit(3, None)      # block 3 was last used in request 1 itself
    oracle.request_index = 2
    assert not oracle.admit(1, None)      # no reference after request 2


def test_oracle_reused_is_a_ceiling_row_between_lru_and_belady():
    records = conversations(900, seed=5, block_tokens=512)
    out = compare(Split.by_time(records, 0.5), Tiers(30, 200),
                  ["lru", "learned", "oracle-reused", "belady"])
    by = {r["policy"]: r["token_hit_ratio"] for r in out["policies"]}
    # it refuses every block that never returns, so it beats LRU; it cannot beat MIN
    assert by["lru"] < by["oracle-reused"] <= by["belady"]


def test_evaluate_sizes_the_prefill_servers_unless_told(trace, capsys):
    from kvtier.policy.cost import CostParams, servers_for
    from kvtier.policy.readers import open_trace

    argv = ["--trace", str(trace), "--gpu-tokens", "15360", "--cpu-tokens", "51200",
            "--policies", "lru", "--json"]
    auto = json.loads(run_verb(argv, capsys))
    split = Split.by_time(list(open_trace(trace).requests()), 0.5)
    assert auto["prefill_servers"] == servers_for(split.records[split.count_from:],
                                                  CostParams())
    # sized on full recompute: hits and promotions only lower the load
    assert auto["policies"][0]["prefill_utilisation"] <= 0.8 + 1e-9
    given = json.loads(run_verb(argv + ["--prefill-servers", "7"], capsys))
    assert given["prefill_servers"] == 7
    parser = argparse.ArgumentParser()
    evaluate.add_arguments(parser)
    with pytest.raises(KvtierError, match="'auto' or an int"):
        evaluate.run(parser.parse_args(argv + ["--prefill-servers", "0"]))
