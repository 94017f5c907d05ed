"""`kvtier probe ...` end to end through the CLI: one JSON object, --out, bad input."""

from __future__ import annotations

import json

from kvtier.cli import main


def test_headroom_prints_one_json_object_and_saves_it(capsys, tmp_path):
    out = tmp_path / "results" / "headroom.json"
    assert main(["probe", "headroom", "--json", "--block-bytes", "64KiB", "--reserve", "0",
                 "--out", str(out)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads(out.read_text())
    assert printed["probe"] == "headroom" and printed["safe_blocks"] == printed["safe_bytes"] // 65536


def test_transfer_and_fs_run_small(capsys, tmp_path):
    assert main(["probe", "transfer", "--json", "--sizes", "4KiB", "--repeats", "2"]) == 0
    assert json.loads(capsys.readouterr().out)["rows"][0]["size_bytes"] == 4096
    assert main(["probe", "fs", "--json", "--dir", str(tmp_path), "--sizes", "4KiB",
                 "--threads", "1", "--blocks", "2"]) == 0
    assert len(json.loads(capsys.readouterr().out)["rows"]) == 2


def test_bad_values_are_one_line_errors(capsys, tmp_path):
    assert main(["probe", "fs", "--dir", str(tmp_path), "--threads", "one"]) == 2
    assert "--threads must be comma-separated integers" in capsys.readouterr().err
    assert main(["probe", "transfer", "--sizes", "12parsecs"]) == 2
    assert "12parsecs" in capsys.readouterr().err
