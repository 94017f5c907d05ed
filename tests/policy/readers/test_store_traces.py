"""Simulated replays written into kvtier's DuckDB store read back through ``--format store``
with the same hit ratio (the store reader is kvtier.collector.reader; this checks the seam)."""

import json

import pytest

from kvtier.collector.events import Origin
from kvtier.collector.recorder import Recorder
from kvtier.collector.store import TraceStore
from kvtier.cli import main
from kvtier.policy.readers import open_trace
from kvtier.policy.sim.config import SimConfig
from kvtier.policy.sim.simulator import Simulator, simulate
from tests.policy.sim.simtools import measured, random_prefix_trace


@pytest.fixture
def store_path(tmp_path):
    records = random_prefix_trace(21, n_requests=60)
    recorder = Recorder(Origin("kvtier-sim", "test", "sim:1"))
    sim = Simulator(SimConfig(gpu_blocks=30, cpu_blocks=60, semantics="vllm"),
                    events=lambda e: recorder.record(
                        e.kind, e.block_hash, request_id=e.request_id, parent_hash=e.parent_hash,
                        position=e.position, tokens=e.tokens, tier_from=e.tier_from,
                        tier_to=e.tier_to, time_s=e.time_s))
    sim.replay(records, on_request=lambda r, o: recorder.record_request(measured(r, o, "sim")))
    path = tmp_path / "traces.duckdb"
    store = TraceStore(path)
    store.ingest(recorder.take_events())
    store.close()
    return path, records


def test_store_trace_replays_like_the_original(store_path, capsys):
    path, records = store_path
    again = list(open_trace(path, "store").requests())
    assert [r.block_hashes for r in again] == [r.block_hashes for r in records]
    assert main(["simulate", "--trace", str(path), "--format", "store", "--gpu-tokens", "inf",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    expected = simulate(records, SimConfig(gpu_blocks=None))
    assert out["token_hit_ratio"] == pytest.approx(expected.token_hit_ratio)


def test_a_store_and_its_segments_yield_one_engine_and_phase_when_asked(tmp_path, capsys):
    from kvtier.collector.batch import EventBatch
    from kvtier.collector.events import RequestRecord
    from kvtier.collector.segments import export_segments

    path = tmp_path / "two.duckdb"
    with TraceStore(path) as store:
        for engine, phase, n in (("load-probe", "gpu-only", 5), ("load-probe", "gpu+cpu", 3),
                                 ("reference", "gpu-only", 7)):
            rows = [RequestRecord(f"{engine}-{phase}-{i}", float(i), 32, 2, block_hashes=(1, 2),
                                  block_size_tokens=16, tier_config_id=phase) for i in range(n)]
            store.ingest(EventBatch.from_rows(Origin(engine, "i", f"{engine}/{phase}"), 0,
                                              requests=rows))
        export_segments(store, tmp_path / "segments")
    for source in (path, tmp_path / "segments"):
        picked = list(open_trace(source, "store", tier_config_id="gpu-only",
                                 engine="load-probe").requests())
        assert len(picked) == 5 and {r.request_id.split("-gpu")[0] for r in picked} == {"load-probe"}
        assert len(list(open_trace(source, "store", engine="reference").requests())) == 7
    assert main(["analyze", "--trace", str(tmp_path / "segments"), "--tier-config", "gpu+cpu",
                 "--source-engine", "load-probe", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["trace"]["requests"] == 3
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 512, "output_length": 1, "hash_ids": [1]}\n')
    assert main(["analyze", "--trace", str(trace), "--tier-config", "gpu-only"]) == 2
    assert "select the requests of a store" in capsys.readouterr().err
