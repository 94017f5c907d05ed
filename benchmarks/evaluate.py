"""``kvtier evaluate`` at scale: wall time and peak RSS on the full WEKA set, 64-token blocks.

Run: ``python benchmarks/evaluate.py --json`` (needs ``--traces`` with the WEKA archive;
``--smoke`` runs on the bundled WEKA slice instead, to check the benchmark runs).

Each figure is one ``kvtier evaluate`` process (``--split requests --gpu-tokens 409600
--cpu-tokens 819200``, no ``--coarsen``): ``lru_belady_*`` with ``--policies lru,belady``,
``learned_*`` adding every learned policy (``learned,learned-retention,learned-next-use,
learned-safe,recommended``; skip with ``--skip-learned``). The
baseline, measured in the same run, is the floor every evaluate pays: reading the trace into
its arrays (``read_*``, one process that only reads). ``block_refs`` and ``distinct_blocks``
size the trace; ``bytes_per_distinct_block`` is the replay's peak RSS over the read's, per
distinct block.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRACES = ROOT.parent / "shared" / "traces"
SMOKE_TRACE = ROOT / "kvtier" / "data" / "weka_agentic_slice.tar.gz"  # bundled: --smoke's trace
# the keys of the --json object (every run prints them; tests/test_benchmarks.py checks)
FIGURES = ("block_refs", "distinct_blocks", "read_s", "read_peak_rss_mb", "lru_belady_s",
           "lru_belady_peak_rss_mb", "token_hit_ratio", "bytes_per_distinct_block")
LEARNED = "lru,belady,learned,learned-retention,learned-next-use,learned-safe,recommended"
ARGS = ("--split", "requests", "--gpu-tokens", "409600", "--cpu-tokens", "819200", "--json")
READ = """
import sys, numpy as np
from kvtier.policy.readers import WekaReader
from kvtier.policy.sim.compiled import core
from kvtier.policy.sim.trace import strip_blocks
records, trace = strip_blocks(WekaReader(sys.argv[1]).requests())
interner = core().Interner()
interner.ids(trace.hashes)
print(trace.block_refs, len(interner))
"""


def measured(command: list[str]) -> tuple[float, float, str]:
    """(wall s, peak RSS MiB, stdout) of one child process (its own rusage, by wait4)."""
    start = time.perf_counter()
    with tempfile.TemporaryFile("w+") as stdout, tempfile.TemporaryFile("w+") as stderr:
        child = subprocess.Popen(command, stdout=stdout, stderr=stderr, cwd=ROOT)
        _, status, usage = os.wait4(child.pid, 0)
        child.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - start
        stdout.seek(0)
        stderr.seek(0)
        if child.returncode != 0:
            raise SystemExit(f"{' '.join(command[:4])}... failed: {stderr.read()[-2000:]}")
        return wall, usage.ru_maxrss / 1024, stdout.read()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--traces", type=Path, default=TRACES, help="folder of the real traces")
    parser.add_argument("--skip-learned", action="store_true",
                        help="leave out the run with the learned policies")
    parser.add_argument("--smoke", action="store_true", help="the bundled WEKA slice, without "
                        "the learned run: seconds, checks the benchmark runs (figures mean nothing)")
    args = parser.parse_args()
    weka = SMOKE_TRACE if args.smoke else args.traces / "weka" / "traces_dev.tar.gz"
    if not weka.exists():
        print(f"no trace at {weka}", file=sys.stderr)
        return 2
    python = sys.executable
    read_s, read_mb, read_out = measured([python, "-c", READ, str(weka)])
    refs, distinct = map(int, read_out.split())
    out = {"block_refs": refs, "distinct_blocks": distinct, "read_s": read_s,
           "read_peak_rss_mb": read_mb}
    evaluate = [python, "-m", "kvtier", "evaluate", "--trace", str(weka), *ARGS]
    wall, rss, text = measured([*evaluate, "--policies", "lru,belady"])
    rows = {r["policy"]: r["token_hit_ratio"] for r in json.loads(text)["policies"]}
    out.update(lru_belady_s=wall, lru_belady_peak_rss_mb=rss, token_hit_ratio=rows,
               bytes_per_distinct_block=(rss - read_mb) * 2**20 / distinct)
    if not (args.skip_learned or args.smoke):
        wall, rss, text = measured([*evaluate, "--policies", LEARNED])
        out.update(learned_s=wall, learned_peak_rss_mb=rss,
                   learned_token_hit_ratio={r["policy"]: r["token_hit_ratio"]
                                            for r in json.loads(text)["policies"]})
    if args.json:
        print(json.dumps(out))
    else:
        for key, value in out.items():
            print(f"{key:28} {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
