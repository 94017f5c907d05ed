"""The load probe: prompts reproduce the trace's prefix sharing exactly; the ramp's
percentiles agree with percentiles computed by DuckDB from the stored rows."""

from __future__ import annotations

import functools
import itertools
import random

import pytest

from kvtier.collector.events import RequestRecord
from kvtier.probes.active.client import stream_completion
from kvtier.probes.active.load import LoadConfig, run_load
from kvtier.load import store_result
from kvtier.probes.active.prompts import PromptBuilder
from kvtier.refengine.server import MODEL_NAME, EngineServer, ServerSettings
from tests.refengine.conftest import tiny_config


def trace_record(i: int, ids, prompt_tokens=None, block=512) -> RequestRecord:
    ids = tuple(ids)
    return RequestRecord(f"t{i}", float(i), prompt_tokens or len(ids) * block, 8, ids, block)


def test_shared_block_ids_give_shared_token_prefixes_and_distinct_ids_never_collide():
    builder = PromptBuilder(block_tokens=2, vocab_size=5)  # 25 distinct blocks possible
    rng = random.Random(3)
    ids = rng.sample(range(1 << 60), 25)
    blocks = {i: tuple(builder.block(i)) for i in ids}
    assert len(set(blocks.values())) == 25
    a = builder.prompt(trace_record(0, ids[:4]))
    b = builder.prompt(trace_record(1, ids[:2] + ids[5:7]))
    assert a[:4] == b[:4] and a[4:6] != b[4:6]
    assert builder.prompt(trace_record(2, ids[:4])) == a  # deterministic per id
    with pytest.raises(ValueError, match="distinct block ids"):
        builder.block(12345)


def test_a_partial_last_block_is_a_prefix_of_the_full_block():
    builder = PromptBuilder(block_tokens=16, vocab_size=512)
    full = builder.prompt(trace_record(0, [7, 8]))
    part = builder.prompt(trace_record(1, [7, 8], prompt_tokens=512 + 128))
    assert len(part) == 16 + 4 and full[:20] == part


def test_max_blocks_truncates_to_whole_blocks():
    builder = PromptBuilder(block_tokens=4, vocab_size=97, max_blocks=2)
    record = trace_record(0, [1, 2, 3], prompt_tokens=2 * 512 + 10)
    assert builder.prompt(record) == builder.block(1) + builder.block(2)
    assert builder.block_ids(record) == (1, 2)


@pytest.fixture
def server():
    srv = EngineServer(tiny_config(gpu_blocks=40), ServerSettings(port=0))
    try:
        yield srv.start()
    finally:
        srv.stop()


def synthetic_trace(n: int):
    """Conversations: turn k of session s extends turn k-1's block ids."""
    counter = itertools.count(1000)
    sessions = [[next(counter)] for _ in range(4)]
    for i in range(n):
        ids = sessions[i % 4]
        ids.append(next(counter))
        yield trace_record(i, list(ids))


@pytest.mark.timeout(120)
def test_ramp_records_every_request_and_store_percentiles_agree(server, tmp_path):
    send = functools.partial(stream_completion, server.url, timeout_s=60)
    config = LoadConfig(concurrency=(1, 3), requests_per_level=8, max_tokens=3, block_tokens=4,
                        max_blocks=6, vocab_size=97)
    result = run_load(synthetic_trace(16), send, config)
    assert len(result.records) == 16 and result.errors == ()
    first_turn, later = result.records[0], result.records[4]  # same session, one turn apart
    assert later.gpu_hit_tokens == 2 * 4 and first_turn.gpu_hit_tokens == 0
    assert all(r.output_tokens == 3 and r.ttft_s > 0 and r.e2e_latency_s >= r.ttft_s for r in result.records)
    assert {(r.finish_status, r.model) for r in result.records} == {("length", MODEL_NAME)}
    summary = result.summary()
    assert summary["by_concurrency"].keys() == {"1", "3"}

    path = tmp_path / "load.duckdb"
    assert store_result(result, str(path), server.url) == 16
    from kvtier.collector.store import TraceStore

    with TraceStore(path) as store:
        for metric in ("ttft_s", "itl_s", "e2e_latency_s"):
            row = store.query(f"SELECT quantile_cont({metric}, [0.5, 0.95, 0.99]) AS q FROM requests").to_pylist()[0]
            ours = summary["overall"][metric]
            assert row["q"] == pytest.approx([ours["p50"], ours["p95"], ours["p99"]], rel=1e-9)


def test_refused_requests_are_counted_as_errors(server):
    send = functools.partial(stream_completion, server.url, timeout_s=60)
    config = LoadConfig(concurrency=(1,), requests_per_level=2, max_tokens=2, block_tokens=4,
                        max_blocks=None, vocab_size=97)
    too_long = [trace_record(0, range(50)), trace_record(1, [1, 2])]
    result = run_load(too_long, send, config)
    assert len(result.records) == 1 and len(result.errors) == 1 and "HTTP 400" in result.errors[0]


def test_unreachable_server_is_a_one_line_error(capsys):
    from kvtier.cli import main

    assert main(["probe", "load", "--url", "http://127.0.0.1:9", "--requests", "1"]) == 1
    assert "--url http://127.0.0.1:9: no OpenAI-compatible server" in capsys.readouterr().err


@pytest.mark.timeout(120)
def test_load_verb_stores_rows_named_by_phase(server, tmp_path, capsys):
    import json

    from kvtier.cli import main

    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps({"timestamp": i, "input_length": 1024, "output_length": 4,
                                         "hash_ids": [0, 10 + i]}) + "\n" for i in range(6)))
    store = tmp_path / "rows.duckdb"
    assert main(["probe", "load", "--url", server.url, "--trace", str(trace), "--requests", "2",
                 "--concurrency", "1,2", "--offset", "2", "--max-tokens", "2", "--block-tokens", "4",
                 "--vocab-size", "97", "--phase", "baseline", "--store", str(store), "--json"]) == 0
    body = json.loads(capsys.readouterr().out)
    assert body["requests"] == 4 and body["errors"] == 0
    from kvtier.collector.store import TraceStore

    with TraceStore(store) as s:
        rows = s.query("SELECT tier_config_id, block_hashes FROM requests ORDER BY arrival_s").to_pylist()
    # the reference engine names its own phase; trace ids 12..15 follow the offset of 2
    assert [r["block_hashes"] for r in rows] == [[0, 12], [0, 13], [0, 14], [0, 15]]
    assert {r["tier_config_id"] for r in rows} == {"gpu-only"}
    # token ids beyond the server's vocabulary: every request fails, and the verb says why
    assert main(["probe", "load", "--url", server.url, "--trace", str(trace), "--requests", "1",
                 "--concurrency", "1", "--block-tokens", "4"]) == 2
    assert "all 1 requests failed; the first: HTTP 400" in capsys.readouterr().err
