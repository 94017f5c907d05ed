"""Per-call cost of kvtier's learned next-use cache policy (behind its online LRU shadow)
inside vLLM's CPU offloading manager, beside vLLM's own LRU policy on the same call sequence,
in the same run.

Run: ``python benchmarks/next_use_policy.py --json`` (needs a vLLM environment,
``$KVTIER_VLLM_PYTHON`` or ``.venv-vllm``; about a minute; ``--smoke``: tiny inputs, to
check it runs). For each CPU tier size, requests
of ``--blocks`` new blocks in ``--sessions`` conversations (a gateway's session tags, arrival
times 1 s apart) fill vLLM's real ``CPUOffloadingManager`` and keep it full, so every store
evicts. The model is fitted on the same synthetic conversations (``kvtier.policy.learn``), written
as the JSON the plug-in loads. Printed: microseconds per store call (prepare + complete +
the request's finish) for ``lru``, ``KvtierNextUsePolicy`` as it runs (its online shadow
choosing the order: the share of stores it made in the learned order) and the same pinned to
the learned order (the costliest case), each with the part of it the interpreter's garbage
collector took (the heap frozen after set-up, as vLLM's engine freezes it: vLLM's
``freeze_gc_heap``), and the owning requests the learned order ranked per eviction (its cost
grows with them).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

ENGINE_ENV = "KVTIER_VLLM_PYTHON"  # the vLLM environment the policies run in
# the keys of the --json object (every run prints them; tests/test_benchmarks.py checks)
FIGURES = ("blocks_per_request", "sessions", "rows", "load_average")
SMOKE = {"chunks": "64", "sessions": 20, "requests": 200}  # --smoke's sizes
# vLLM's LRU; kvtier's policy as it runs (its shadow choosing the order); the same pinned to
# the learned order (the costliest: the tier's order and the learned ghost's both rank)
POLICIES = ("lru", "KvtierNextUsePolicy", "KvtierNextUsePolicy@learned")


def _model_file(path: Path, sessions: int, blocks: int) -> None:
    """A next-use model of conversations like the benchmark's (main environment)."""
    from kvtier.collector.events import RequestRecord
    from kvtier.policy.learn.deploy import deployment
    from kvtier.policy.learn.nextuse_fit import fit_next_use
    from kvtier.policy.learn.nextuse import Readout

    records, history = [], {s: [] for s in range(sessions)}
    for i in range(sessions * 20):
        s = (i * 7919) % sessions
        history[s] = history[s] + [i * 1000 + b for b in range(blocks)]
        records.append(RequestRecord(f"r{i}", float(i), len(history[s]) * 16,
                                     block_hashes=tuple(history[s]), block_size_tokens=16,
                                     session_id=f"s{s}", finish_status="stopped",
                                     stop_reason="end_turn" if i % 3 else "tool_use",
                                     e2e_latency_s=0.5, output_tokens=20))
    model = fit_next_use(records)
    path.write_text(json.dumps(deployment(model, Readout("next_use"))))


class _GcClock:
    """Seconds the interpreter's cyclic garbage collector has run since it was made: which
    store call a collection lands in depends on every allocation before it, so it is counted
    apart (the heap is frozen first, as vLLM's engine freezes it after start-up; unfrozen, a
    full collection of a process holding vLLM and torch took most of the per-call figures)."""

    def __init__(self) -> None:
        import gc

        self.seconds, self._began = 0.0, None
        self._gc = gc
        gc.callbacks.append(self._tick)

    def _tick(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._began = time.perf_counter()
        elif self._began is not None:
            self.seconds += time.perf_counter() - self._began
            self._began = None

    def stop(self) -> None:
        self._gc.callbacks.remove(self._tick)


def _drive(policy: str, chunks: int, sessions: int, blocks: int, requests: int) -> dict:
    """In a vLLM process: time ``requests`` stores through vLLM's manager with ``policy``."""
    from vllm.v1.kv_offload.base import ReqContext, make_offload_key
    from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

    policy, _, pinned = policy.partition("@")
    kwargs = {"cache_policy": policy}
    if policy != "lru":
        kwargs["cache_policy_module_path"] = "kvtier.probes.vllm.next_use_policy"
    manager = CPUOffloadingManager(num_chunks=chunks, **kwargs)
    lock = getattr(manager, "lock", None) or nullcontext()
    history = {s: 0 for s in range(sessions)}
    elapsed, timed, owners, learned = 0.0, 0, [], 0
    shadow = getattr(manager._policy, "state", None)
    if pinned:  # the tier kept in one order whatever its ghosts score
        shadow.pin(pinned)
    state = getattr(shadow, "state", shadow)  # the learned order behind the plug-in's shadow
    try:  # what a serving engine does after start-up: its static objects out of the collector's way
        from vllm.utils.gc_utils import freeze_gc_heap
    except ImportError:
        freeze_gc_heap = None
    if freeze_gc_heap is not None:
        freeze_gc_heap()
    collecting = _GcClock()
    gc_s = 0.0
    for i in range(requests):
        s = (i * 7919) % sessions
        first = history[s]
        history[s] += blocks
        keys = [make_offload_key((s << 32 | b).to_bytes(32, "big"), 0)
                for b in range(first, first + blocks)]
        ctx = ReqContext(f"r{i}", kv_transfer_params={"kvtier": {
            "session_id": f"s{s}", "arrival_s": float(i), "block_tokens": 16}})
        for position, key in enumerate(keys):
            ctx.set_offload_key_position(key, (first + position + 1) * 16)
        full = i >= chunks // blocks + 1
        if full and state is not None:
            owners.append(len(state._members))
        began, gc_began = time.perf_counter(), collecting.seconds
        with lock:
            out = manager.prepare_store(keys, ctx)
            if out is not None:
                manager.complete_store(out.keys_to_store, ctx)
            manager.on_request_finished(ctx)
        if full:
            elapsed += time.perf_counter() - began
            gc_s += collecting.seconds - gc_began
            timed += 1
            learned += getattr(shadow, "following", None) == "learned"
    collecting.stop()
    return {"us_per_store": elapsed / max(1, timed) * 1e6, "timed_stores": timed,
            "gc_us_per_store": gc_s / max(1, timed) * 1e6,
            "learned_share": learned / max(1, timed) if shadow is not None else None,
            "owners_mean": sum(owners) / len(owners) if owners else None}


def _us(result: dict) -> str:
    return (f"{result['us_per_store']:7.1f} us/store "
            f"(of which garbage collection {result['gc_us_per_store']:.1f})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chunks", default="1024,4096,16384",
                        help="CPU tier sizes in chunks, comma-separated")
    parser.add_argument("--blocks", type=int, default=8, help="new blocks per request")
    parser.add_argument("--sessions", type=int, default=400, help="conversations")
    parser.add_argument("--requests", type=int, default=4000, help="requests per size")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--smoke", action="store_true", help="tiny inputs, seconds: checks the "
                        "benchmark runs (its figures mean nothing)")
    parser.add_argument("--inside", help=argparse.SUPPRESS)  # the vLLM side: policy:chunks
    args = parser.parse_args()
    if args.smoke:
        vars(args).update(SMOKE)
    if args.inside:
        policy, chunks = args.inside.split(":")
        print("RESULT " + json.dumps(_drive(policy, int(chunks), args.sessions, args.blocks,
                                            args.requests)))
        return 0
    from tests.probes.vllm.environments import VLLM_PYTHONS

    python = VLLM_PYTHONS["0.33"]
    if not Path(python).exists():
        print(f"no vLLM environment at {python} (make builds it)", file=sys.stderr)
        return 2
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "next-use.json"
        _model_file(model, args.sessions, args.blocks)
        env = dict(os.environ, PYTHONPATH=str(ROOT), KVTIER_NEXT_USE_MODEL=str(model))
        for chunks in (int(c) for c in args.chunks.split(",")):
            row = {"chunks": chunks}
            for policy in POLICIES:
                done = subprocess.run(
                    [python, __file__, "--inside", f"{policy}:{chunks}", "--blocks",
                     str(args.blocks), "--sessions", str(args.sessions), "--requests",
                     str(args.requests)], capture_output=True, text=True, env=env, timeout=600)
                line = next((l for l in done.stdout.splitlines() if l.startswith("RESULT ")),
                            None)
                if line is None:
                    print(done.stderr[-2000:], file=sys.stderr)
                    return 1
                row[policy] = json.loads(line[len("RESULT "):])
            rows.append(row)
            if not args.json:
                lru, shadowed, learned = (row[p] for p in POLICIES)
                print(f"CPU {chunks:>6} chunks: lru {_us(lru)}, "
                      f"next-use as its shadow chose {_us(shadowed)} "
                      f"({shadowed['us_per_store'] / lru['us_per_store']:.1f}x, "
                      f"{shadowed['learned_share']:.0%} of stores in the learned order), "
                      f"pinned to the learned order {_us(learned)} "
                      f"({learned['us_per_store'] / lru['us_per_store']:.1f}x), "
                      f"{learned['owners_mean']:.0f} owning requests ranked per eviction",
                      flush=True)
    if args.json:
        print(json.dumps({"blocks_per_request": args.blocks, "sessions": args.sessions,
                          "rows": rows, "load_average": os.getloadavg()[0]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
