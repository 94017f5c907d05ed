"""`kvtier evaluate --policies recommended`: the admission and eviction pair chosen on the
training period, never unsafe where a raw learned order is, and prefill seconds beside hit
ratios."""

from __future__ import annotations

import argparse
import json

import pytest

from kvtier.errors import KvtierError
from kvtier.policy.learn.request_signals import FEATURES
from kvtier.verbs import evaluate
from tests.policy.learn import traffic
from tests.policy.learn.test_evaluate import run_verb, write_mooncake


def test_recommended_stays_with_lru_where_the_learned_order_turned_unsafe(tmp_path, capsys):
    path = write_mooncake(tmp_path / "shift.jsonl", traffic.mixed(hours=0.5, seed=0, shift=True))
    out = run_verb(["--trace", str(path), "--gpu-tokens", "512000", "--cpu-tokens", "4096000",
                    "--policies", "lru,learned-next-use,recommended,belady", "--json"], capsys)
    rows = {r["policy"]: r for r in json.loads(out)["policies"]}
    lru = rows["lru"]["token_hit_ratio"]
    assert rows["learned-next-use"]["unsafe"] is True
    assert rows["recommended"]["unsafe"] is False
    assert rows["recommended"]["token_hit_ratio"] >= lru - 0.005
    assert rows["lru"]["unsafe"] is False and rows["belady"]["unsafe"] is False
    # prefill seconds, cost-model priced: Belady saves the most; the gap is closed on them too
    assert rows["belady"]["prefill_s"] < rows["lru"]["prefill_s"]
    assert rows["belady"]["prefill_gap_closed"] == 1.0 and rows["lru"]["prefill_gap_closed"] == 0.0
    recommended = json.loads(out)["learned"]["recommended"]
    assert recommended["chosen_on"].startswith("training period's latest ")
    assert recommended["validation"][0][0] == "admit all + LRU"
    assert recommended["deploys"] in recommended["why"]
    # the signals that mattered on later time, for the learned order
    importance = json.loads(out)["learned"]["learned-next-use"]["importance_later"]
    assert importance["rows"] == json.loads(out)["evaluated_requests"]
    assert {d["feature"] for d in importance["features"]} == set(FEATURES)


def test_text_output_flags_unsafe_rows(tmp_path, capsys):
    path = write_mooncake(tmp_path / "shift.jsonl", traffic.mixed(hours=0.5, seed=0, shift=True))
    out = run_verb(["--trace", str(path), "--gpu-tokens", "512000", "--cpu-tokens", "4096000",
                    "--policies", "lru,learned-next-use,belady"], capsys)
    line = next(line for line in out.splitlines() if line.startswith("learned-next-use "))
    assert line.endswith("UNSAFE")
    assert "UNSAFE: lost to LRU on the evaluated (later) requests" in out
    assert "next-use signals on later time (permutation importance over " in out


def test_candidates_deploys_every_pair_on_the_evaluated_requests(tmp_path, capsys):
    """``--candidates``: every pair ``recommended`` chose among, deployed as it deploys the
    chosen one, on the evaluated requests. On traffic that shifts after training the slice's
    favourite falls behind pairs it ranked lower, and the text says by how much."""
    path = write_mooncake(tmp_path / "shift.jsonl", traffic.mixed(hours=0.5, seed=0, shift=True))
    argv = ["--trace", str(path), "--gpu-tokens", "256000", "--cpu-tokens", "1024000",
            "--policies", "lru,recommended"]
    out = json.loads(run_verb([*argv, "--candidates", "--json"], capsys))
    rows = {r["policy"]: r["token_hit_ratio"] for r in out["policies"]}
    recommended = out["learned"]["recommended"]
    candidates = recommended["candidates"]
    assert [c["pair"] for c in candidates] == [v[0] for v in recommended["validation"]]
    assert [c["validation_hit_ratio"] for c in candidates] == [
        v[1] for v in recommended["validation"]]
    (chosen,) = [c for c in candidates if c["chosen"]]
    assert chosen["pair"] == recommended["deploys"]
    assert chosen["evaluated_hit_ratio"] == rows["recommended"]
    # plain LRU admitting every block is deployed as the lru row is: the same replay
    assert candidates[0]["pair"] == "admit all + LRU"
    assert candidates[0]["evaluated_hit_ratio"] == pytest.approx(rows["lru"], abs=1e-12)
    best = max(candidates, key=lambda c: c["evaluated_hit_ratio"])
    assert best["evaluated_hit_ratio"] > chosen["evaluated_hit_ratio"] + 0.01

    text = run_verb([*argv, "--candidates"], capsys)
    table = text[text.index("  candidate pair"):].splitlines()
    assert len(table) == 1 + len(candidates) + 1
    marked = [line for line in table[1:-1] if line.startswith("* ")]
    assert len(marked) == 1 and chosen["pair"] in marked[0]
    assert f"{best['pair']} served " in table[-1]
    # which ghost the deployed tier followed: plain LRU, the simple rule, the chosen pair
    shadow = recommended["shadow"]
    assert shadow["names"] == ["lru", "admit on sighting 2 + LRU", recommended["deploys"]]
    followed = next(line for line in text.splitlines() if "the tier followed: " in line)
    total = sum(shadow["requests_by_mode"])
    assert (f"admit on sighting 2 + LRU {shadow['requests_by_mode'][1] / total:.0%}" in followed
            and f"({shadow['switches']} switches)" in followed)
    assert (f"{(best['evaluated_hit_ratio'] - chosen['evaluated_hit_ratio']) * 100:.2f} points "
            "more") in table[-1]
    # without --candidates, no table and no replays beyond the chosen pair's
    assert "candidate pair" not in run_verb(argv, capsys)


def test_candidates_needs_recommended(tmp_path):
    path = write_mooncake(tmp_path / "t.jsonl", traffic.mixed(hours=0.05, seed=1))
    parser = argparse.ArgumentParser()
    evaluate.add_arguments(parser)
    args = parser.parse_args(["--trace", str(path), "--gpu-tokens", "256000", "--cpu-tokens",
                              "1024000", "--policies", "lru,belady", "--candidates"])
    with pytest.raises(KvtierError, match="add recommended to --policies"):
        evaluate.run(args)
