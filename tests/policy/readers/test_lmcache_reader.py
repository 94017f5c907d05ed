"""LMCache's lookup-hash logs as a trace: fields, ids, folders, errors naming file and line,
sniffing; the command line offers every reader's format."""

import json
import re

import pytest

from kvtier.policy.readers import (
    FORMATS,
    READERS,
    LmcacheReader,
    TraceFormatError,
    open_trace,
    sniff_format,
)

LONG = "0x" + "ab" * 24 + "0000000000000007"  # a 256-bit hash whose low 64 bits are 7


def lookup(ts=1.0, rid="req-0-cold", hashes=("0x1", "0x2"), seq_len=513, chunk=256, **extra):
    return {"timestamp": ts, "request_id": rid, "model_name": "m", "chunk_size": chunk,
            "seq_len": seq_len, "dtypes": ["torch.float16"], "shapes": [[2, 2, 256, 128]],
            "chunk_hashes": list(hashes), **extra}


def write(path, *lines):
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_a_lookup_is_a_request_of_its_full_chunks(tmp_path):
    path = write(tmp_path / "lookup_hashes_20260401_000000_000000.jsonl",
                 lookup(ts=12.5, hashes=("0x1", LONG), seq_len=513))
    (record,) = LmcacheReader(path).requests()
    assert record.request_id == "req-0-cold" and record.arrival_s == 12.5
    assert record.prompt_tokens == 513 and record.output_tokens is None
    assert record.block_hashes == (1, 7) and record.block_size_tokens == 256
    assert record.model == "m"


def test_a_folder_is_every_log_file_in_it_by_timestamp(tmp_path):
    write(tmp_path / "lookup_hashes_20260401_000000_000000.jsonl",
          lookup(ts=1.0, rid="a"), lookup(ts=5.0, rid="c"))
    write(tmp_path / "lookup_hashes_20260401_060000_000001.jsonl",
          lookup(ts=3.0, rid="b"), lookup(ts=5.0, rid="d"))
    (tmp_path / "notes.txt").write_text("not a log")
    assert sniff_format(tmp_path) == "lmcache"
    assert [r.request_id for r in open_trace(tmp_path).requests()] == ["a", "b", "c", "d"]


def test_a_single_file_is_sniffed_by_its_first_lookup(tmp_path):
    path = write(tmp_path / "hashes.jsonl", lookup())
    assert sniff_format(path) == "lmcache"


@pytest.mark.parametrize("line, problem", [
    (lookup(hashes=("0x1", "0x2", "0x3"), seq_len=512), "has 3 hashes but seq_len covers 2"),
    (lookup(hashes=("0x1", "zz")), "chunk_hashes holds 'zz'"),
    (lookup(hashes=("0x1", 2)), "chunk_hashes holds 2"),
    (lookup(chunk=0), "chunk_size must be > 0"),
    (lookup(layer="x"), "unknown field(s) layer"),
])
def test_a_bad_lookup_names_file_and_line(tmp_path, line, problem):
    path = write(tmp_path / "lookup_hashes_x.jsonl", lookup(), line)
    with pytest.raises(TraceFormatError, match=f"lookup_hashes_x.jsonl:2: .*{re.escape(problem)}"):
        list(LmcacheReader(path).requests())


def test_a_block_size_asked_for_must_be_the_logs(tmp_path):
    path = write(tmp_path / "lookup_hashes_x.jsonl", lookup(chunk=256))
    assert len(list(open_trace(path, "lmcache", block_tokens=256).requests())) == 1
    with pytest.raises(TraceFormatError, match="chunk_size 256 differs from the block size"):
        list(open_trace(path, "lmcache", block_tokens=512).requests())


def test_skip_bad_counts_the_bad_lookups_of_every_file(tmp_path):
    write(tmp_path / "lookup_hashes_1.jsonl", lookup(rid="a"), {"timestamp": 2})
    write(tmp_path / "lookup_hashes_2.jsonl", lookup(rid="b", hashes=("0xq",)))
    reader = LmcacheReader(tmp_path, skip_bad=True)
    assert [r.request_id for r in reader.requests()] == ["a"] and reader.skipped == 2


def test_a_folder_without_logs_is_one_line(tmp_path):
    with pytest.raises(TraceFormatError, match="no lookup_hashes_\\*.jsonl files"):
        LmcacheReader(tmp_path)


def test_the_command_line_offers_every_readers_format():
    from kvtier.cli import build_parser

    parser = build_parser()
    verbs = next(a for a in parser._actions if a.choices and "simulate" in a.choices).choices
    fmt = next(a for a in verbs["simulate"]._actions if "--format" in a.option_strings)
    assert tuple(fmt.choices) == FORMATS == (*READERS, "store")
