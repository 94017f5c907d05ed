"""Trace readers: formats, validation errors naming file and line, skip counting, sniffing."""

import gzip
import io
import json
import tarfile

import pytest

from kvtier.collector.events import UINT64_MAX
from kvtier.policy.readers import (
    BailianReader,
    MooncakeReader,
    TraceFormatError,
    WekaLayout,
    WekaReader,
    open_trace,
    sniff_format,
)


def write_lines(path, objs):
    path.write_text("".join(json.dumps(o) + "\n" for o in objs))
    return path


def mooncake_line(ts=0, n_in=1000, out=10, ids=(0, 1)):
    return {"timestamp": ts, "input_length": n_in, "output_length": out, "hash_ids": list(ids)}


# ---- Mooncake ----

def test_mooncake_record_fields_and_units(tmp_path):
    path = write_lines(tmp_path / "t.jsonl", [mooncake_line(ts=3000, n_in=1025, ids=(0, 1, 2))])
    (record,) = MooncakeReader(path).requests()
    assert record.arrival_s == 3.0
    assert record.prompt_tokens == 1025 and record.output_tokens == 10
    assert record.block_hashes == (0, 1, 2) and record.block_size_tokens == 512
    assert record.request_id == "t:1"


def test_mooncake_sorts_by_arrival_keeping_file_order_on_ties(tmp_path):
    lines = [mooncake_line(ts=6000, ids=(5, 6)), mooncake_line(ts=0, ids=(0, 1)),
             mooncake_line(ts=0, ids=(0, 2))]
    records = list(MooncakeReader(write_lines(tmp_path / "t.jsonl", lines)).requests())
    assert [r.block_hashes for r in records] == [(0, 1), (0, 2), (5, 6)]


@pytest.mark.parametrize("line, problem", [
    ('{"timestamp": 0, "input_length": 10', "invalid JSON"),
    (json.dumps(mooncake_line(n_in=-5, ids=())), "input_length must be a non-negative integer"),
    (json.dumps(mooncake_line(n_in=2000, ids=(0,))), "hash_ids has 1 ids but ceil"),
    (json.dumps({**mooncake_line(), "speed": 1}), "unknown field(s) speed"),
    (json.dumps({"timestamp": 0, "input_length": 5, "hash_ids": [0]}), "missing field(s) output_length"),
    (json.dumps(mooncake_line(ids=(0, UINT64_MAX + 1))), "unsigned 64-bit"),
    ("[1, 2]", "expected a JSON object"),
    (json.dumps(mooncake_line(n_in=1500, ids=(7, 8, 7))),
     "hash_ids repeats id 7 (at positions 0 and 2); ids are prefix-chained"),
])
def test_mooncake_bad_line_names_file_and_line(tmp_path, line, problem):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(mooncake_line()) + "\n\n" + line + "\n")
    with pytest.raises(TraceFormatError) as caught:
        list(MooncakeReader(path).requests())
    assert str(caught.value).startswith(f"{path}:3: ")
    assert problem in str(caught.value)


def test_skip_bad_counts_and_keeps_good_lines(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(mooncake_line()) + "\n{oops\n" + json.dumps(mooncake_line(ts=1)) + "\n")
    reader = MooncakeReader(path, skip_bad=True)
    assert len(list(reader.requests())) == 2
    assert reader.skipped == 1


def test_mooncake_real_trace_counts(mooncake_path):
    records = list(MooncakeReader(mooncake_path).requests())
    assert len(records) == 12031
    assert sum(len(r.block_hashes) for r in records) == 288500
    assert len({h for r in records for h in r.block_hashes}) == 182790
    assert all(r.block_hashes[0] == 0 for r in records)


# ---- Bailian ----

def bailian_line(chat, parent, ts, n_in, ids, turn=1, kind="text"):
    return {"chat_id": chat, "parent_chat_id": parent, "timestamp": ts, "input_length": n_in,
            "output_length": 7, "type": kind, "turn": turn, "hash_ids": list(ids)}


def test_bailian_sessions_follow_parent_chains(tmp_path):
    lines = [bailian_line(159, -1, 1.5, 33, (1, 2, 3)),
             bailian_line(7, -1, 2.0, 16, (9,), kind="api"),
             bailian_line(160, 159, 61.1, 40, (1, 2, 3), turn=2),
             bailian_line(161, 160, 70.0, 48, (1, 2, 3), turn=3)]
    path = tmp_path / "qwen.jsonl.gz"
    with gzip.open(path, "wt") as handle:
        handle.writelines(json.dumps(o) + "\n" for o in lines)
    records = list(BailianReader(path).requests())
    assert [r.request_id for r in records] == ["159", "7", "160", "161"]
    assert [r.session_id for r in records] == ["159", "7", "159", "159"]
    assert [r.parent_request_id for r in records] == [None, None, "159", "160"]
    assert records[2].turn == 2 and records[1].request_type == "api"
    assert records[0].block_size_tokens == 16 and records[0].arrival_s == 1.5


def test_bailian_rejects_hash_count_against_16_token_blocks(tmp_path):
    path = write_lines(tmp_path / "q.jsonl", [bailian_line(1, -1, 0.0, 33, (1, 2))])
    with pytest.raises(TraceFormatError, match=r"q.jsonl:1: hash_ids has 2 ids but ceil\(input_length/16\) gives 3"):
        list(BailianReader(path).requests())


# ---- WEKA ----

def weka_doc(conv_id, requests):
    return {"id": conv_id, "block_size": 64, "hash_id_scope": "local", "requests": requests}


def weka_req(t, n_in, ids):
    return {"t": t, "type": "n", "in": n_in, "out": 5, "hash_ids": list(ids)}


def write_tar(path, docs):
    with tarfile.open(path, "w:gz") as archive:
        for doc in docs:
            data = json.dumps(doc).encode()
            info = tarfile.TarInfo(f"{doc['id']}.json")
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return path


def test_weka_namespaces_ids_and_lays_conversations_out_in_time(tmp_path):
    sub = {"t": 10.0, "type": "subagent", "requests": [weka_req(0.0, 64, (1,)), weka_req(5.0, 128, (1, 9))]}
    docs = [weka_doc("a", [weka_req(0.0, 130, (1, 2)), sub, weka_req(100.0, 200, (1, 2, 3))]),
            weka_doc("b", [weka_req(0.0, 130, (1, 2))])]
    path = write_tar(tmp_path / "w.tar.gz", docs)
    records = list(WekaReader(path, layout=WekaLayout(start_gap_s=50.0)).requests())
    assert [(r.session_id, r.arrival_s) for r in records] == [
        ("a", 0.0), ("a", 10.0), ("a", 15.0), ("b", 50.0), ("a", 100.0)]
    a_first, b_first = records[0].block_hashes, records[3].block_hashes
    assert a_first != b_first  # same local ids, different conversations
    assert records[1].block_hashes[0] == a_first[0]  # sub-agents share the parent's namespace
    assert [r.request_type for r in records] == ["main", "subagent", "subagent", "main", "main"]
    assert all(0 <= h <= UINT64_MAX for r in records for h in r.block_hashes)
    again = list(WekaReader(path, layout=WekaLayout(start_gap_s=50.0)).requests())
    assert [r.block_hashes for r in again] == [r.block_hashes for r in records]  # deterministic


def test_weka_request_signals_say_how_each_request_ended_and_who_started_it(tmp_path):
    tool = {**weka_req(0.0, 130, (1, 2)), "stop": "tool_use", "model": "m-1", "api_time": 2.5}
    sub = {"t": 10.0, "type": "subagent", "requests": [
        {**weka_req(0.0, 64, (7,)), "stop": "end_turn", "model": "m-small"}]}
    cut = {**weka_req(20.0, 200, (1, 2, 3)), "stop": "max_tokens"}
    silent = {**weka_req(30.0, 200, (1, 2, 3)), "stop": ""}
    path = write_tar(tmp_path / "w.tar.gz", [weka_doc("a", [tool, sub, cut, silent])])
    records = list(WekaReader(path).requests())
    assert [(r.finish_status, r.stop_reason) for r in records] == [
        ("stopped", "tool_use"), ("stopped", "end_turn"), ("length", "max_tokens"), (None, None)]
    assert [r.model for r in records] == ["m-1", "m-small", None, None]
    assert records[0].e2e_latency_s == 2.5 and records[2].e2e_latency_s is None
    # the sub-agent names the main request that started it; main requests have no parent
    assert [r.parent_request_id for r in records] == [None, records[0].request_id, None, None]


def test_weka_rejects_a_model_that_is_not_text(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps(weka_doc("c", [{**weka_req(0.0, 64, (1,)), "model": 3}])))
    with pytest.raises(TraceFormatError, match=r"requests\[0\]: model must be a string, got 3"):
        list(WekaReader(path).requests())


def test_weka_hashes_only_full_blocks(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps(weka_doc("c", [weka_req(0.0, 130, (1, 2, 3))])))
    with pytest.raises(TraceFormatError, match=r"c.json: requests\[0\]: hash_ids has 3 ids but in // 64 gives 2"):
        list(WekaReader(path).requests())


def test_weka_bad_conversation_is_skipped_whole_with_skip_bad(tmp_path):
    (tmp_path / "good.json").write_text(json.dumps(weka_doc("good", [weka_req(0.0, 64, (1,))])))
    (tmp_path / "bad.json").write_text("{truncated")
    reader = WekaReader(tmp_path, skip_bad=True)
    assert [r.session_id for r in reader.requests()] == ["good"]
    assert reader.skipped == 1


def test_weka_layout_rejects_negative_gap():
    with pytest.raises(ValueError, match="start_gap_s must be >= 0, got -1"):
        WekaLayout(start_gap_s=-1)


# ---- sniffing ----

def test_sniff_by_content_and_name(tmp_path):
    moon = write_lines(tmp_path / "m.jsonl", [mooncake_line()])
    qwen = write_lines(tmp_path / "q.jsonl", [bailian_line(1, -1, 0.0, 16, (1,))])
    assert sniff_format(moon) == "mooncake" and sniff_format(qwen) == "bailian"
    assert sniff_format(tmp_path / "x.tar.gz") == "weka"
    assert isinstance(open_trace(moon), MooncakeReader)
    assert open_trace(moon, block_tokens=256).block_tokens == 256


def test_unknown_format_is_a_clear_error(tmp_path):
    path = write_lines(tmp_path / "other.jsonl", [{"prompt": "hi"}])
    with pytest.raises(TraceFormatError, match="matches no known trace format; allowed: mooncake, weka, bailian"):
        open_trace(path)
    with pytest.raises(TraceFormatError, match="unknown trace format 'csv'"):
        open_trace(path, format="csv")
    with pytest.raises(FileNotFoundError):
        open_trace(tmp_path / "missing.jsonl")


def test_truncated_gzip_is_a_clear_error(tmp_path):
    path = tmp_path / "qwen.jsonl.gz"
    line = json.dumps(bailian_line(1, -1, 0.0, 16, (1,))) + "\n"
    data = gzip.compress((line * 200).encode())
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(TraceFormatError, match=r"qwen.jsonl.gz:\d+: unreadable"):
        list(BailianReader(path).requests())


def test_truncated_weka_archive_is_a_clear_error(tmp_path):
    path = write_tar(tmp_path / "w.tar.gz", [weka_doc(f"c{i}", [weka_req(0.0, 64, (1,))]) for i in range(50)])
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(TraceFormatError, match="w.tar.gz: unreadable archive"):
        list(WekaReader(path).requests())
