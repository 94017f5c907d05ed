"""After a push, the collector watches the promise live: ``recommend --check``'s own check on
the store the collector writes, kept beside the recommendation (where the collector's
``kvtier_recommendation_info`` and the dashboard read it) and exported per promise."""

from __future__ import annotations

import dataclasses
import json

from kvtier.collector.batch import EventBatch
from kvtier.collector.events import Origin
from kvtier.collector.exports.recommendation import CHECK_FILE, RecommendationLabels
from kvtier.collector.store import TraceStore
from kvtier.guardrail.promise_watch import PromiseWatch
from tests.policy.recommend.test_promises import phase_two, recommended, run, served  # noqa: F401


def holds(watch) -> dict:
    return {s.labels["metric"]: s.value for s in watch.samples() if s.name == "kvtier_promise_holds"}


def test_the_promise_is_judged_as_recommend_check_judges_it_once_enough_requests_arrive(
        recommended, tmp_path, clock, capsys):
    store_file, reco, doc = recommended
    copy = tmp_path / "kvtier.duckdb"
    copy.write_bytes(store_file.read_bytes())
    ratio = doc["evidence"]["token_hit_ratio"]["vllm"]
    needed = doc["evidence"]["train_requests"] + doc["evidence"]["evaluated_requests"]
    config = phase_two(copy, doc, ratio, 10)
    folder = tmp_path / "reco"
    folder.mkdir()
    (folder / "recommendation.json").write_text(reco.read_text())
    watch = PromiseWatch(folder / "recommendation.json", clock=clock)
    with TraceStore(copy) as store:
        watch.start(store)
        watch.refresh()
        assert watch.result.requests == 10 and not watch.result.enough and holds(watch) == {}
        assert json.loads((folder / CHECK_FILE).read_text())["more_needed"] == needed - 10
        store.ingest(EventBatch.from_rows(Origin("vllm", "node-1", "node-1/phase-2b"), 1, [], [
            dataclasses.replace(r, request_id=f"late-{r.request_id}", arrival_s=r.arrival_s + 1e5)
            for r in served(needed, ratio, ttft_s=None, config=config, start_s=1e6)]))
        watch.refresh()
    assert holds(watch)["token_hit_ratio"] == 1.0
    live = json.loads((folder / CHECK_FILE).read_text())
    assert live["held"] is True and live["watched_s"] == clock()
    # the same verdict recommend --check gives on the same store
    capsys.readouterr()
    assert run(["--check", str(folder / "recommendation.json"), "--store", str(copy), "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert {k: v for k, v in live.items() if k != "watched_s"} == answer
    assert RecommendationLabels(folder / "recommendation.json")()["promises"] == "held"


def test_a_missed_promise_is_exported_as_not_holding(recommended, tmp_path):
    store_file, reco, doc = recommended
    copy = tmp_path / "kvtier.duckdb"
    copy.write_bytes(store_file.read_bytes())
    phase_two(copy, doc, max(0.0, doc["evidence"]["token_hit_ratio"]["vllm"] - 0.1), 400)
    folder = tmp_path / "reco"
    folder.mkdir()
    (folder / "recommendation.json").write_text(reco.read_text())
    watch = PromiseWatch(folder / "recommendation.json")
    with TraceStore(copy) as store:
        watch.start(store)
        watch.refresh()
    assert holds(watch)["token_hit_ratio"] == 0.0
    measured = [s for s in watch.samples() if s.name == "kvtier_promise_value"
                and s.labels["kind"] == "measured" and s.labels["metric"] == "token_hit_ratio"]
    assert measured and measured[0].labels["tier_config"].startswith("gpu+cpu:")


def test_no_recommendation_yet_or_a_broken_one_exports_nothing(tmp_path, store):
    watch = PromiseWatch(tmp_path / "recommendation.json")
    watch.start(store)
    watch.refresh()
    assert list(watch.samples()) == [] and not (tmp_path / CHECK_FILE).exists()
    (tmp_path / "recommendation.json").write_text("{not json")
    watch.refresh()
    assert list(watch.samples()) == [] and watch.problem
