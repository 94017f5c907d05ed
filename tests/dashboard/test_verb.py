"""`kvtier dashboard`: the child command it builds, its input checks, and a fast CLI path."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from kvtier.errors import KvtierError
from kvtier.verbs import dashboard as verb


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    verb.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_command_binds_loopback_by_default_and_passes_the_segments(tmp_path):
    command = verb.streamlit_command(parse("--segments", str(tmp_path), "--port", "18555"))
    assert command[1:4] == ["-m", "streamlit", "run"] and command[4].endswith("dashboard/app.py")
    assert command[command.index("--server.address") + 1] == "127.0.0.1"
    assert command[command.index("--server.port") + 1] == "18555"
    assert command[command.index("--server.headless") + 1] == "true"
    assert command[command.index("--browser.gatherUsageStats") + 1] == "false"
    assert command[-2:] == ["--segments", str(tmp_path.resolve())]


def test_planning_folders_are_passed_through(tmp_path):
    command = verb.streamlit_command(parse("--segments", str(tmp_path), "--whatif", str(tmp_path / "w")))
    assert command[-2:] == ["--whatif", str((tmp_path / "w").resolve())]


@pytest.mark.parametrize("argv, named", [(("--port", "0"), "--port"), (("--port", "70000"), "70000"),
                                         (("--host", ""), "--host")])
def test_bad_input_is_a_kvtier_error_naming_it(argv, named, tmp_path):
    with pytest.raises(KvtierError, match=named):
        verb.streamlit_command(parse("--segments", str(tmp_path), *argv))


def test_missing_segments_and_planning_files_are_refused(tmp_path):
    with pytest.raises(KvtierError, match="no such folder"):
        verb.streamlit_command(parse("--segments", str(tmp_path / "nope")))
    (tmp_path / "w.json").write_text("{}")
    with pytest.raises(KvtierError, match="--whatif .* is a file"):
        verb.streamlit_command(parse("--segments", str(tmp_path), "--whatif", str(tmp_path / "w.json")))


def test_a_busy_port_or_a_foreign_address_is_one_line_before_streamlit_starts():
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        with pytest.raises(KvtierError, match="address already in use") as error:
            verb.check_address("127.0.0.1", busy.getsockname()[1])
    assert error.value.exit_code == 1
    with pytest.raises(KvtierError, match="not an address of this machine") as error:
        verb.check_address("10.255.255.1", 8501)
    assert error.value.exit_code == 2


def test_segments_that_is_a_file_is_refused(tmp_path):
    path = tmp_path / "store.duckdb"
    path.write_bytes(b"x")
    with pytest.raises(KvtierError, match="folder"):
        verb.streamlit_command(parse("--segments", str(path)))


@pytest.mark.timeout(60)
def test_cli_path_does_not_import_streamlit_or_duckdb():
    code = ("import sys, kvtier.cli; kvtier.cli.build_parser(); "
            "print(sorted(m for m in ('streamlit', 'duckdb', 'kvtier.dashboard.data') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=False).stdout
    assert "streamlit" not in out and "kvtier.dashboard.data" not in out
