"""The data layer against independent oracles: raw segment rows read back with DuckDB or
``SegmentReader``, and numpy percentiles."""

from __future__ import annotations

from collections import defaultdict

import duckdb
import numpy as np
import pytest

from kvtier.collector.batch import EventBatch
from kvtier.collector.events import BlockEvent, Origin, Outcome, RequestRecord, Tier
from kvtier.collector.reader import SegmentReader
from kvtier.collector.segments import export_segments, segments_relation
from kvtier.dashboard import queries, reuse
from kvtier.dashboard.data import Filters, SegmentData, bucket_width_s, segment_signature
from kvtier.dashboard.facets import read_facets
from tests.dashboard.fixtures import PHASES, build_two_loads


@pytest.fixture
def data(full_segments):
    with SegmentData(full_segments) as d:
        yield d


def raw_events(root, where="TRUE"):
    con = duckdb.connect()
    return con.sql(f"SELECT * FROM {segments_relation(root, 'block_events')} WHERE {where}").df()


def test_facets_list_engines_instances_and_configs_in_rollout_order(data, full_segments):
    facets = read_facets(data)
    assert facets.engines == ("vllm",)
    assert facets.instances == ("node-a", "node-b")
    assert facets.tier_configs == PHASES
    assert facets.block_events == len(raw_events(full_segments))
    assert facets.requests == 360 and not facets.simulated_only and not facets.empty


def test_hit_quality_counts_every_lookup_once_per_configuration(data, full_segments):
    frame, unit = queries.hit_quality(data, Filters(), (None, None), "blocks")
    assert unit == "blocks"
    lookups = raw_events(full_segments, "CAST(kind AS VARCHAR) IN "
                         "('gpu_hit', 'cpu_promotion', 'cold_promotion', 'recompute_miss')")
    assert frame["amount"].sum() == len(lookups)
    totals = queries.outcome_totals(frame).set_index(["tier_config", "outcome"])["amount"]
    assert set(totals["gpu-only"].index) == {"gpu_hit", "recompute_miss"}  # no tier below GPU yet
    assert totals["gpu+cpu+cold"]["cold_promotion"] > 0
    shares = frame.groupby(["time", "tier_config"])["share"].sum()
    assert np.allclose(shares, 1.0)


def test_hit_quality_headline_is_shares_of_prompt_tokens_not_of_events(tmp_path):
    # one request: 3 GPU-hit blocks of 16 tokens, 1 recompute-miss block, and a 40-token tail
    # past the last full block that only the record counts: events say 75% hits, tokens 48/104
    origin = Origin("vllm", "node-a", "node-a/test")
    events = [BlockEvent(100.0 + i, Outcome.GPU_HIT if i < 3 else Outcome.RECOMPUTE_MISS, 10 + i,
                         request_id="r1", position=i, tokens=16) for i in range(4)]
    record = RequestRecord("r1", 100.0, prompt_tokens=104, block_hashes=(10, 11, 12, 13),
                           block_size_tokens=16, gpu_hit_tokens=48, cpu_promotion_tokens=0,
                           cold_promotion_tokens=0, recomputed_tokens=56, tier_config_id="gpu+cpu")
    from kvtier.collector.store import TraceStore

    with TraceStore(":memory:") as store:
        store.ingest(EventBatch.from_rows(origin, 1, events, [record]))
        export_segments(store, tmp_path)
    with SegmentData(tmp_path) as data:
        tokens, unit = queries.hit_quality(data, Filters(), (None, None))
        assert unit == "tokens"
        shares = queries.outcome_totals(tokens).set_index("outcome")["share"]
        assert shares["gpu_hit"] == pytest.approx(48 / 104)
        assert shares["recompute_miss"] == pytest.approx(56 / 104)
        lookups, unit = queries.hit_quality(data, Filters(), (None, None), "blocks")
        assert unit == "blocks"
        assert queries.outcome_totals(lookups).set_index("outcome")["share"]["gpu_hit"] == 0.75
        with pytest.raises(ValueError, match="basis must be one of tokens, blocks"):
            queries.hit_quality(data, Filters(), (None, None), "events")


def test_filters_narrow_by_instance_configuration_and_time(data, full_segments):
    everything = queries.hit_quality(data, Filters(), (None, None))[0]["amount"].sum()
    one = queries.hit_quality(data, Filters(instances=("node-a",)), (None, None))[0]
    assert 0 < one["amount"].sum() < everything
    phase = queries.hit_quality(data, Filters(tier_configs=("gpu+cpu",)), (None, None))[0]
    assert set(phase["tier_config"]) == {"gpu+cpu"}
    facets = read_facets(data)
    middle = (facets.start_s + facets.end_s) / 2
    early = queries.hit_quality(data, Filters(end_s=middle), (None, None))[0]
    late = queries.hit_quality(data, Filters(start_s=middle), (None, None))[0]
    assert early["amount"].sum() + late["amount"].sum() == everything
    assert queries.hit_quality(data, Filters(engines=("sglang",)), (None, None))[0].empty


def test_load_wait_percentiles_match_numpy_per_source_tier(data, full_segments):
    # every block event of these fixtures is its own load job (its own time)
    frame = queries.load_wait(data, Filters()).set_index(["source_tier", "quantile"])
    assert set(frame.index.get_level_values(0)) == {"cpu", "cold", "recompute"}
    cpu = raw_events(full_segments, "CAST(kind AS VARCHAR) = 'cpu_promotion'")["latency_s"] * 1000
    for q, label in ((50, "p50"), (95, "p95"), (99, "p99")):
        assert frame.loc[("cpu", label), "latency_ms"] == pytest.approx(np.percentile(cpu, q))
    assert frame.loc[("cold", "p50"), "latency_ms"] > frame.loc[("cpu", "p50"), "latency_ms"]


def test_ttft_and_itl_percentiles_per_phase_match_the_records(data, full_segments):
    frame = queries.request_latency(data, Filters()).set_index(["tier_config", "metric", "quantile"])
    ttft = defaultdict(list)
    for record in SegmentReader(full_segments).requests():
        ttft[record.tier_config_id].append(record.ttft_s * 1000)
    for phase in PHASES:
        assert frame.loc[(phase, "ttft", "p99"), "latency_ms"] == pytest.approx(np.percentile(ttft[phase], 99))
        assert frame.loc[(phase, "ttft", "p99"), "requests"] == len(ttft[phase])


def test_reuse_counts_match_the_requests_block_lists(data, full_segments):
    users = defaultdict(set)  # (configuration, block) -> requests: reuse within a configuration
    for record in SegmentReader(full_segments).requests():
        for block in record.block_hashes:
            users[(record.tier_config_id, block)].add(record.request_id)
    analysis = reuse.ReuseAnalysis(data, Filters())
    classes = analysis.classes().set_index("rank")["blocks"]
    assert classes.sum() == len(users)
    assert classes[0] == sum(1 for r in users.values() if len(r) == 1)
    gaps = analysis.gaps()
    assert gaps["uses"].sum() == sum(len(r) - 1 for r in users.values())
    position = analysis.by_position().set_index("position")
    assert position.loc[0, "shared_share"] == 1.0  # every prompt starts with a shared prefix


def test_stored_blocks_never_promoted_are_counted(data):
    stores = reuse.stores_never_promoted(data, Filters())
    assert 0 < stores["never_promoted"] <= stores["stored_blocks"]


def test_request_only_segments_count_tokens(simulated_segments):
    with SegmentData(simulated_segments) as data:
        facets = read_facets(data)
        assert facets.simulated_only and facets.block_events == 0
        frame, unit = queries.hit_quality(data, Filters(), (facets.start_s, facets.end_s))
        records = list(SegmentReader(simulated_segments).requests())
        assert unit == "tokens"
        assert frame["amount"].sum() == sum(r.prompt_tokens for r in records)
        assert queries.load_wait(data, Filters()).empty
        assert reuse.ReuseAnalysis(data, Filters()).classes()["blocks"].sum() > 0  # from block_hashes


def test_missing_or_empty_folder_is_empty_data_not_an_error(empty_segments, tmp_path):
    for root in (empty_segments, tmp_path / "never-created"):
        with SegmentData(root) as data:
            assert read_facets(data).empty
            assert queries.hit_quality(data, Filters(), (None, None))[1] == ""
            assert reuse.ReuseAnalysis(data, Filters()).classes().empty


@pytest.mark.parametrize("kwargs, named", [
    ({"engines": "vllm"}, "engines"), ({"start_s": float("nan")}, "start_s"),
    ({"start_s": 10.0, "end_s": 5.0}, "start_s 10.0"),
])
def test_bad_filters_name_the_bad_value(kwargs, named):
    with pytest.raises(ValueError, match=named):
        Filters(**kwargs)


def test_bucket_width_is_round_and_gives_about_sixty_buckets():
    assert bucket_width_s(0.0, 3600.0) == 60
    assert bucket_width_s(0.0, 0.0) == 1
    assert bucket_width_s(0.0, 1e9) == 86400


def test_configuration_filter_reaches_event_queries(data):
    baseline = queries.load_wait(data, Filters(tier_configs=("gpu-only",)))
    assert set(baseline["source_tier"]) == {"recompute"}  # nothing below GPU to promote from
    assert reuse.stores_never_promoted(data, Filters(tier_configs=("gpu-only",)))["stored_blocks"] == 0


def test_segment_signature_changes_when_segments_are_added(tmp_path):
    assert segment_signature(tmp_path / "missing") == (0, 0.0)
    before = segment_signature(tmp_path)
    (tmp_path / "block_events" / "day=2027-01-15").mkdir(parents=True)
    (tmp_path / "block_events" / "day=2027-01-15" / "b1.parquet").write_bytes(b"")
    assert segment_signature(tmp_path)[0] == before[0] + 1


def test_footer_facets_agree_with_a_full_scan(data, full_segments):
    facets = read_facets(data)
    scan = raw_events(full_segments)
    assert facets.start_s == pytest.approx(scan["time_s"].min(), abs=1e-3)
    assert facets.end_s >= scan["time_s"].max() - 1e-3
    assert facets.block_events == len(scan)


def test_files_holding_two_engines_fall_back_to_a_scan(store, tmp_path):
    for number, engine in enumerate(("vllm", "sglang")):
        origin = Origin(engine, "node-1", f"{engine}/s")
        store.ingest(EventBatch.from_rows(origin, 0, [BlockEvent(1_800_000_000.0 + number, Outcome.GPU_HIT, 5)]))
    export_segments(store, tmp_path)
    with SegmentData(tmp_path) as data:
        facets = read_facets(data)
    assert facets.engines == ("sglang", "vllm") and facets.block_events == 2


def test_a_request_id_replayed_per_configuration_counts_in_each(store, origin, tmp_path):
    """A replayed trace reuses request ids once per tier configuration (kvtier demo does):
    each run's lookups belong to the run that had arrived when they happened."""
    t0 = 1_800_000_000.0
    runs = (("gpu-only", t0, Outcome.RECOMPUTE_MISS, None), ("gpu+cpu", t0 + 3600, Outcome.CPU_PROMOTION, Tier.CPU))
    for sequence, (config, arrival, kind, source) in enumerate(runs):
        events = [BlockEvent(arrival + 0.01 * i, kind, 77 + i, request_id="trace:1", position=i,
                             tier_from=source, latency_s=0.001) for i in range(3)]
        store.ingest(EventBatch.from_rows(origin, sequence, events,
                                          [RequestRecord("trace:1", arrival, 48, tier_config_id=config)]))
    export_segments(store, tmp_path)
    with SegmentData(tmp_path) as data:
        frame, _ = queries.hit_quality(data, Filters(), (t0, t0 + 3600))
        totals = queries.outcome_totals(frame).set_index(["tier_config", "outcome"])["amount"].to_dict()
        assert totals == {("gpu-only", "recompute_miss"): 3.0, ("gpu+cpu", "cpu_promotion"): 3.0}
        promoted = queries.load_wait(data, Filters(tier_configs=("gpu+cpu",)))
        assert set(promoted["source_tier"]) == {"cpu"}


def test_p99_over_time_covers_every_request_once(data):
    facets = read_facets(data)
    frame = queries.latency_over_time(data, Filters(), (facets.start_s, facets.end_s))
    ttft = frame[frame["metric"] == "ttft"].groupby("tier_config")["requests"].sum()
    assert ttft.to_dict() == dict(zip(facets.phases["tier_config"], facets.phases["requests"]))
    assert (frame["p99_ms"] > 0).all()


def test_a_loads_wait_counts_once_per_job_not_once_per_block(tmp_path):
    with SegmentData(build_two_loads(tmp_path)) as data:
        wait = queries.load_wait(data, Filters()).set_index("quantile")
        assert set(wait["jobs"]) == {2} and set(wait["blocks"]) == {6}
        # per job: the median of 40 and 10 ms; per block it would be 40 (four of six blocks)
        assert wait.loc["p50", "latency_ms"] == pytest.approx(25.0)
        assert wait["mean_ms"].tolist() == pytest.approx([25.0] * 3)
        sizes = queries.size_latency(data, Filters()).set_index("job_bytes")
        assert sizes["jobs"].to_dict() == {2 << 20: 1, 4 << 20: 1}
        # a job's bandwidth is its bytes over its one wait, not over the wait once per block
        assert sizes.loc[4 << 20, "bandwidth_bytes_per_s"] == pytest.approx((4 << 20) / 0.040)


def test_the_engines_copy_time_per_job_sits_beside_the_wait_it_is_part_of(tmp_path):
    with SegmentData(build_two_loads(tmp_path)) as data:
        copy = queries.copy_time(data, Filters())
        assert copy[["instance", "jobs", "copied_bytes"]].values.tolist() == [["node-a", 2.0, float(2 << 22)]]
        assert copy.loc[0, "mean_copy_ms"] == pytest.approx(3.0)
        wait = queries.load_wait(data, Filters())
        assert copy.loc[0, "mean_copy_ms"] < wait["mean_ms"].iloc[0]  # the rest is queueing
        # the second interval ends after 1_800_000_005: a range up to then counts the first job
        early = queries.copy_time(data, Filters(end_s=1_800_000_002.0))
        assert early.loc[0, "jobs"] == 1 and early.loc[0, "mean_copy_ms"] == pytest.approx(4.0)
        # a scrape does not say which configuration's requests it counted
        assert queries.copy_time(data, Filters(tier_configs=("gpu+cpu",))).empty
    with SegmentData(tmp_path / "none") as empty:
        assert queries.copy_time(empty, Filters()).empty


def test_the_headline_is_each_outcomes_share_per_configuration(data):
    totals = queries.outcome_totals(queries.hit_quality(data, Filters(), (None, None))[0])
    headline = queries.headline(totals, list(PHASES))
    assert list(headline["tier_config"]) == [p for p in PHASES for _ in queries.OUTCOME_ORDER]
    assert list(headline["outcome"]) == list(queries.OUTCOME_ORDER) * len(PHASES)
    records = list(SegmentReader(data.root).requests())
    for phase in PHASES:
        mine = [r for r in records if r.tier_config_id == phase]
        assert headline[headline["tier_config"] == phase].set_index("outcome")["amount"].to_dict() == {
            "gpu_hit": sum(r.gpu_hit_tokens for r in mine),
            "cpu_promotion": sum(r.cpu_promotion_tokens for r in mine),
            "cold_promotion": sum(r.cold_promotion_tokens for r in mine),
            "recompute_miss": sum(r.recomputed_tokens for r in mine)}
    assert headline.groupby("tier_config")["share"].sum().tolist() == pytest.approx([1.0] * 3)
    nothing = queries.headline(queries.outcome_totals(queries.empty_frame("tier_config", "outcome", "amount")))
    assert nothing.empty
