"""The command line: verbs, help with examples, one-line errors, fast start, the demo."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from kvtier import __version__
from kvtier.cli import VERBS, main


def kvtier(*args, **kwargs):
    return subprocess.run([sys.executable, "-m", "kvtier", *args], capture_output=True, text=True,
                          timeout=120, **kwargs)


def test_top_level_help_lists_every_architecture_verb():
    out = kvtier("--help").stdout
    for verb in ("demo", "collect", "analyze", "simulate", "recommend", "push", "probe", "rollout", "dashboard"):
        assert verb in VERBS and f"    {verb}" in out


@pytest.mark.parametrize("verb", sorted(VERBS))
def test_each_verb_has_help_with_an_example(verb, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([verb, "--help"])
    assert exit_info.value.code == 0
    assert "example:\n  kvtier " + verb in capsys.readouterr().out


def test_version():
    assert kvtier("--version").stdout.strip() == f"kvtier {__version__}"


def test_help_imports_no_heavy_package():
    probe = ("import sys; from kvtier.cli import build_parser; build_parser(); "
             "print(sorted(m for m in ('torch', 'sklearn', 'streamlit', 'pandas', 'duckdb', 'pyarrow', 'zmq') "
             "if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "[]"


def test_missing_store_is_a_one_line_error(tmp_path):
    result = kvtier("store", "info", str(tmp_path / "nope.duckdb"))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"kvtier store: error: no store at {tmp_path / 'nope.duckdb'} (create one with 'kvtier demo' or 'kvtier collect')"]


def test_a_file_that_is_not_a_store_is_a_one_line_error(tmp_path):
    bogus = tmp_path / "bogus.duckdb"
    bogus.write_text("hello")
    result = kvtier("store", "info", str(bogus))
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1 and "is not a DuckDB store" in result.stderr


def test_bad_value_is_rejected_with_the_allowed_form(tmp_path):
    result = kvtier("store", "prune", str(tmp_path / "x.duckdb"), "--max-age", "7x")
    assert result.returncode == 2
    assert "bad duration '7x'; use e.g. 90s, 30m, 12h or 7d" in result.stderr


def test_unknown_trace_format_is_a_one_line_error(tmp_path):
    trace = tmp_path / "trace.csv"
    trace.write_text("a,b\n1,2\n")
    result = kvtier("demo", "--out", str(tmp_path / "out"), "--trace", str(trace))
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1 and "format" in result.stderr


def test_rollout_without_a_server_is_a_one_line_error():
    result = kvtier("rollout", "--endpoint", "http://127.0.0.1:9")
    assert result.returncode == 1  # a runtime failure: nothing answers there
    assert len(result.stderr.strip().splitlines()) == 1 and "no OpenAI-compatible server" in result.stderr


def test_store_export_and_prune_from_the_command_line(tmp_path):
    out = tmp_path / "out"
    kvtier("demo", "--out", str(out), "--requests", "30", "--chat-requests", "0", "--no-recommendation")
    store = str(out / "kvtier.duckdb")
    before = json.loads(kvtier("store", "info", store, "--json").stdout)
    exported = kvtier("store", "export", store, "--segments", str(tmp_path / "seg"))
    assert exported.returncode == 0
    assert list((tmp_path / "seg" / "requests").rglob("*.parquet"))
    dry = kvtier("store", "prune", store, "--max-age", "0", "--dry-run")
    assert f"would delete {before['block_events']:,} block event(s)" in dry.stdout
    refused = kvtier("store", "prune", store, "--max-age", "0")
    assert refused.returncode == 2 and "would delete every record" in refused.stderr
    assert json.loads(kvtier("store", "info", store, "--json").stdout) == before
    pruned = kvtier("store", "prune", store, "--max-age", "0", "--yes")
    assert f"and {before['requests']} request(s)" in pruned.stdout
    assert json.loads(kvtier("store", "info", store, "--json").stdout)["block_events"] == 0
