"""What a calibration reads: the selected requests, and the steps and promotion jobs of the
same selection (instance, tier configuration, span), from a real store, its segments, or
its segments while a writer process holds the store."""

from __future__ import annotations

import pytest

from kvtier.collector.calibration_inputs import calibration_inputs
from kvtier.collector.promotion_jobs import read_jobs
from kvtier.collector.reader import open_store
from kvtier.collector.segments import export_segments
from kvtier.collector.storefile import StoreLockedError
from kvtier.collector.store import TraceStore
from tests.collector.calibration_store import A, B, BLOCK_TOKENS, KV_BYTES_PER_TOKEN, hold, records, write


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    """A store of two instances: node-a (a GPU-only phase, then a CPU-tier phase that
    promotes) and node-b (GPU-only, steps 3.5x as costly)."""
    path = tmp_path_factory.mktemp("calibration") / "kvtier.duckdb"
    write(path, A, B)
    return path


def _cost(serving, step) -> float:
    return (serving.overhead_s + step.prefill_tokens * serving.prefill_token_s
            + step.decode_requests * serving.decode_request_s)


def test_an_instance_brings_its_own_steps_and_jobs_only(two):
    mine = calibration_inputs(two, instance="node-a")
    requests, steps, events = records(A)
    assert len(mine.requests) == len(requests) and len(mine.steps) == len(steps)
    assert all(s.duration_s == pytest.approx(_cost(A, s)) for s in mine.steps)  # none of node-b's
    assert len(mine.jobs) == A.phases[1].requests and mine.engines == ("reference",)
    assert mine.kv_bytes_per_token == KV_BYTES_PER_TOKEN and mine.note is None
    assert mine.source == f"the store {two}"
    assert [s.counts() for s in mine.splits] == [
        (r.gpu_hit_tokens, r.cpu_promotion_tokens, 0, r.recomputed_tokens) for r in requests]
    both = calibration_inputs(two)
    assert len(both.steps) == len(steps) + len(records(B)[1])
    assert [r.arrival_s for r in both.requests] == sorted(r.arrival_s for r in both.requests)


def test_a_tier_configuration_brings_that_phases_steps_and_jobs(two):
    first, second = A.phases
    gpu_only = calibration_inputs(two, instance="node-a", tier_config="gpu-only")
    promoting = calibration_inputs(two, instance="node-a", tier_config="gpu+cpu")
    all_steps = records(A)[1]
    assert len(gpu_only.requests) == first.requests and not gpu_only.jobs
    assert len(gpu_only.steps) + len(promoting.steps) == len(all_steps)
    assert max(s.time_s for s in gpu_only.steps) < min(s.time_s for s in promoting.steps)
    assert all(s.loaded_bytes == 0 for s in gpu_only.steps)
    # one job per load: three blocks, their bytes summed, the job's latency once
    assert len(promoting.jobs) == second.requests
    assert {(j.tier, j.blocks, j.size_bytes, j.latency_s) for j in promoting.jobs} == {
        ("cpu", 3, 3 * BLOCK_TOKENS * KV_BYTES_PER_TOKEN, second.load_s)}
    # request ids repeat in every phase: the jobs are the phase's own, not their namesakes'
    assert all(promoting.requests[0].arrival_s <= j.time_s for j in promoting.jobs)
    # across instances: each instance's own window
    everywhere = calibration_inputs(two, tier_config="gpu-only")
    assert len(everywhere.steps) == len(gpu_only.steps) + len(records(B)[1])


def test_a_span_brings_the_steps_of_the_requests_that_arrived_in_it(two):
    whole = calibration_inputs(two, instance="node-a")
    start, end = whole.requests[3].arrival_s, whole.requests[10].arrival_s
    part = calibration_inputs(two, instance="node-a", span=(start, end))
    assert [r.arrival_s for r in part.requests] == [r.arrival_s for r in whole.requests[3:10]]
    last_end = part.requests[-1].arrival_s + part.requests[-1].e2e_latency_s
    assert part.steps == tuple(s for s in whole.steps if start <= s.time_s <= last_end)
    with pytest.raises(ValueError, match="span"):
        calibration_inputs(two, span=(end, start))


def test_segments_read_as_the_store_does(two, tmp_path):
    with TraceStore(two) as store:
        export_segments(store, tmp_path / "segments")
    for select in ({"instance": "node-a"}, {"tier_config": "gpu+cpu"}, {}):
        from_store = calibration_inputs(two, **select)
        from_segments = calibration_inputs(tmp_path / "segments", **select)
        assert from_segments.source == f"the segments in {tmp_path / 'segments'}"
        for name in ("requests", "steps", "jobs", "kv_bytes_per_token", "engines"):
            assert getattr(from_segments, name) == getattr(from_store, name), name


def test_a_store_a_writer_process_holds_is_read_through_its_segments(tmp_path):
    store, lonely = tmp_path / "kvtier.duckdb", tmp_path / "lonely" / "kvtier.duckdb"
    write(store, A, B)
    write(lonely, A)
    with TraceStore(store) as writer:  # what the writer exports, beside its store
        export_segments(writer, tmp_path / "segments")
    unlocked = calibration_inputs(store, instance="node-a", tier_config="gpu+cpu")
    holder = hold(store, lonely)
    try:
        locked = calibration_inputs(store, instance="node-a", tier_config="gpu+cpu")
        with pytest.raises(StoreLockedError, match="pass its Parquet segments"):
            calibration_inputs(lonely, instance="node-a")  # no segments to read instead
    finally:
        holder.kill()
        holder.wait()
    assert locked.note.startswith(f"{store} is held by process {holder.pid}")
    assert locked.source == f"the segments in {tmp_path / 'segments'}"
    for name in ("requests", "steps", "jobs", "kv_bytes_per_token"):
        assert getattr(locked, name) == getattr(unlocked, name), name


def test_the_measured_costs_and_the_calibration_count_the_same_jobs(two):
    reader = open_store(two, instance="node-a")
    try:
        jobs, where = read_jobs(reader)
    finally:
        reader.store.close()
    assert sorted(jobs, key=lambda j: j.time_s) == list(calibration_inputs(two, instance="node-a").jobs)
    assert where == f"the store {two}"


def test_a_load_clients_view_of_the_same_requests_is_left_out_of_the_engines_fit(tmp_path):
    from dataclasses import replace

    from kvtier.collector.batch import EventBatch
    from kvtier.collector.events import Origin

    path = tmp_path / "kvtier.duckdb"
    write(path, A)
    alone = calibration_inputs(path)  # the engine alone: nothing to leave out
    requests, _, _ = records(A)
    seen = [replace(r, ttft_s=r.ttft_s + 0.004) for r in requests]  # the client's clock: later
    with TraceStore(path) as store:  # kvtier probe load recorded the same requests
        store.ingest(EventBatch.from_rows(Origin("load-probe", A.instance, "load"), 0, [], seen))
    client = calibration_inputs(path, engine="load-probe")  # asked for by name: as selected
    assert client.engines == ("load-probe",) and len(client.requests) == len(requests)
    assert client.note is None
    own = calibration_inputs(path)
    assert own.engines == ("reference",) and len(own.requests) == len(requests)
    assert [r.ttft_s for r in own.requests] == [r.ttft_s for r in requests]
    assert (own.steps, own.jobs) == (alone.steps, alone.jobs) and alone.note is None
    assert own.note == "read reference's own records; load-probe's view of the same requests left out"
