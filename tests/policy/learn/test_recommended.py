"""`kvtier evaluate --policies recommended`: the admission and eviction pair chosen on the
training period, never unsafe where a raw learned order is, and prefill seconds beside hit
ratios."""

from __future__ import annotations

import json

from kvtier.policy.learn.request_signals import FEATURES
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
