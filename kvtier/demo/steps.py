"""The demo's other verbs, run in-process exactly as their command lines would run them."""

from __future__ import annotations

import json
from pathlib import Path


def run_verb(verb: str, argv: list[str], say, *, show=lambda line: False) -> list[str]:
    """Run ``kvtier VERB ARGV``, say the command and the lines ``show`` picks, indented;
    return all its output lines."""
    import argparse
    import contextlib
    import importlib
    import io

    module = importlib.import_module(f"kvtier.verbs.{verb}")
    parser = argparse.ArgumentParser(prog=f"kvtier {verb}")
    module.add_arguments(parser)
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
        module.run(parser.parse_args(argv))
    lines = output.getvalue().splitlines()
    say(f"  $ kvtier {verb} {' '.join(argv)}")
    for line in lines:
        if show(line):
            say(f"      {line}")
    return lines


def measure_host(folder: Path, block_bytes: int, say) -> dict[str, Path]:
    """Host memory headroom, and file reads and writes at the engine's block size with the
    page cache on, as the engine's file tier does them (a few seconds)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "fs").mkdir(exist_ok=True)
    paths = {"headroom": folder / "headroom.json", "fs": folder / "fs.json"}
    run_verb("probe", ["headroom", "--json", "--out", str(paths["headroom"])], say)
    run_verb("probe", ["fs", "--json", "--dir", str(folder / "fs"), "--sizes", f"{block_bytes}",
                       "--direct", "off", "--out", str(paths["fs"])], say)
    headroom = json.loads(paths["headroom"].read_text())
    reads = [r for r in json.loads(paths["fs"].read_text())["rows"] if r["op"] == "read"]
    best = min(reads, key=lambda r: r["p50_latency_s"])
    say(f"      host headroom {headroom['safe_bytes'] / 2**30:.1f} GiB safe for a CPU tier "
        f"(limited by {headroom['limited_by']}); a {best['size_bytes'] // 1024} KiB file read "
        f"takes {best['p50_latency_s'] * 1e6:.0f} us (median, {best['threads']} thread(s))")
    return paths
