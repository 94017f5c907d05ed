"""vLLM probe benchmark: KV events from a ZMQ stream into the store, and the spec wrapper's cost.

Run: ``python benchmarks/vllm_events.py --json`` (prints one JSON object; about a minute;
``--frames``/``--events-per-frame``/``--repeat`` scale it; ``--smoke``: tiny inputs, to
check it runs).

* ``events_per_s``: block events decoded and committed per second, end to end. A publisher
  process (as an engine is) sends ``--frames`` vLLM-format frames (``[topic, seq, msgpack
  [ts, events, dp]]``, map events, uint64 hashes) on 127.0.0.1; once all are queued at the
  tap's socket, the :class:`kvtier.probes.vllm.tap.VllmEventTap` drains them as the collector runs it
  (coalescing the frames of each poll, up to ``max_rows_per_batch`` rows per store batch) into
  a file-backed :class:`kvtier.collector.store.TraceStore`; the clock runs from the first poll to the
  last commit. Best of ``--repeat`` runs. Two shapes: ``stored`` (one ``BlockStored`` of
  ``--events-per-frame`` hashes per frame, alternately GPU and CPU) and ``mixed`` (what a vLLM
  step sends: ``BlockStored`` events of 4 hashes with their 64 token ids, group index and spec
  kind, and single-hash GPU ``BlockRemoved`` events, 4 of every 5 block events stored).
* ``events_per_cpu_s...``: the same events per CPU second of the collector process (its
  threads and DuckDB's together): what one free core would sustain, whatever else the
  machine runs.
* ``..._general_decoder``: the same with ``fast_decode=False`` (every frame decoded by the
  general msgpack decoder, the pre-compiled path), measured in the same run: the baseline.
* ``events_per_s_uncoalesced``: one store batch per vLLM frame, on a tenth of the frames (the
  store's fixed cost per batch dominates it).
* ``spec_overhead_ratio``: time of a fixed sequence of manager calls (prepare_store /
  complete_store with evictions, lookup, prepare_load / complete_load) through kvtier's
  ``RecordingOffloadingManager`` divided by the same calls on vLLM's bare
  ``CPUOffloadingManager``, in the same process (best of 7, interleaved). A round records
  10 events (4 evictions, 4 stores, 2 promotions; the lookup hits).
  ``spec_bare_us_per_round`` / ``spec_wrapped_us_per_round`` are the absolute times;
  ``spec_recorder_full_us_per_round`` is the wrapper with its recorder full, so every event
  is dropped before it is packed: wrapped minus full is what packing and appending cost,
  full minus bare the wrapper's own bookkeeping. Needs vLLM: run here if importable, else in
  the side environment (``$KVTIER_VLLM_PYTHON``, default ``.venv-vllm``), else ``null``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

ENGINE_ENV = "KVTIER_VLLM_PYTHON"  # the vLLM environment the spec figures run in
# the keys of the --json object (every run prints them; tests/test_benchmarks.py checks)
FIGURES = ("events_per_s", "events_per_cpu_s", "events_per_s_general_decoder",
           "events_per_s_mixed", "events_per_s_uncoalesced", "spec_overhead_ratio", "frames",
           "events_per_frame")
SMOKE = {"frames": 200, "repeat": 1}  # --smoke's sizes
SMOKE_SPEC = {"rounds": 200, "repeats": 1}


def frame_payloads(frames: int, per_frame: int, shape: str) -> list[bytes]:
    import msgpack

    out = []
    for i in range(frames):
        base = 2**63 + i * per_frame
        if shape == "stored":
            events = [{"type": "BlockStored", "block_hashes": [base + j for j in range(per_frame)],
                       "parent_block_hash": None, "token_ids": [], "block_size": 16,
                       "lora_id": None, "medium": "GPU" if i % 2 else "CPU", "lora_name": None}]
        else:
            events = []
            for j in range(0, per_frame, 5):
                events.append({"type": "BlockStored", "block_hashes": [base + j + k for k in range(4)],
                               "parent_block_hash": base + j - 1, "token_ids": list(range(64)),
                               "block_size": 16, "lora_id": None, "medium": "GPU",
                               "lora_name": None, "group_idx": 0,
                               "kv_cache_spec_kind": "full_attention"})
                events.append({"type": "BlockRemoved", "block_hashes": [base + j + 4],
                               "medium": "GPU", "group_idx": 0})
        out.append(msgpack.packb([1.7e9 + i * 1e-3, events, 0]))
    return out


def _publish(endpoint: str, frames: int, per_frame: int, shape: str, attached, go, sent) -> None:
    import zmq

    payloads = frame_payloads(frames, per_frame, shape)
    ctx = zmq.Context()
    pub = ctx.socket(zmq.XPUB)
    pub.setsockopt(zmq.SNDHWM, 0)
    pub.connect(endpoint)
    pub.recv()  # the tap's subscription: nothing sent from here on is lost
    attached.set()
    go.wait()
    for seq, body in enumerate(payloads):
        pub.send_multipart([b"", seq.to_bytes(8, "big"), body])
    pub.close(linger=-1)
    ctx.term()  # returns once every frame has left
    sent.set()


def events_per_s(frames: int, per_frame: int, shape: str, *, fast: bool = True,
                 coalesce: bool = True, folder: str) -> tuple[float, float]:
    """One run: frames queued at the tap by a publisher process, then drained into a file.
    Events per wall second, and per CPU second of this process (DuckDB's threads included)."""
    from kvtier.collector.store import TraceStore
    from kvtier.probes.vllm.tap import VllmEventTap, VllmTapConfig

    store = TraceStore(Path(tempfile.mkdtemp(dir=folder)) / "bench.duckdb")
    stored = [0]
    tap = VllmEventTap(VllmTapConfig(endpoints=("tcp://127.0.0.1:0",), bind=True,
                                     coalesce_frames=coalesce, fast_decode=fast,
                                     receive_hwm=frames + 10),
                       lambda b: stored.__setitem__(0, stored[0] + store.ingest(b).block_events))
    (endpoint,) = tap.open()
    spawn = multiprocessing.get_context("spawn")
    attached, go, sent = spawn.Event(), spawn.Event(), spawn.Event()
    publisher = spawn.Process(target=_publish,
                              args=(endpoint, frames, per_frame, shape, attached, go, sent))
    publisher.start()
    while not attached.is_set():  # a bound SUB attaches its peers when it is used
        tap.poll(0.01)
    go.set()
    sent.wait(300)  # all frames now wait in the tap's queue
    want = frames * per_frame
    started, cpu_started = time.perf_counter(), time.process_time()
    while stored[0] < want:
        if not tap.poll(0.5) and time.perf_counter() - started > 300:
            raise RuntimeError(f"stalled at {stored[0]} of {want} events")
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    publisher.join()
    tap.close()
    store.close()
    return stored[0] / elapsed, stored[0] / cpu


def stream_figures(frames: int, per_frame: int, repeat: int) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        events_per_s(50, per_frame, "mixed", folder=folder)  # warm-up: imports, first Arrow call
        out = {}
        for shape, prefix in (("stored", "events_per_s"), ("mixed", "events_per_s_mixed")):
            for fast, suffix in ((True, ""), (False, "_general_decoder")):
                runs = [events_per_s(frames, per_frame, shape, fast=fast, folder=folder)
                        for _ in range(repeat)]
                out[prefix + suffix] = round(max(wall for wall, _ in runs))
                out[prefix.replace("_per_s", "_per_cpu_s") + suffix] = round(max(c for _, c in runs))
        out["events_per_s_uncoalesced"] = round(events_per_s(
            max(1, frames // 10), per_frame, "stored", coalesce=False, folder=folder)[0])
    return out


def spec_overhead(rounds: int = 3000, repeats: int = 7) -> dict:
    """Needs vLLM importable in this interpreter. Microseconds per round (best of
    ``repeats``, bare and wrapped interleaved) and the ratio; ``full`` is the wrapper with
    its recorder full (every event dropped before packing): the bookkeeping alone."""
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    from vllm.v1.kv_offload.base import ReqContext, make_offload_key
    from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

    from kvtier.collector.events import Origin
    from kvtier.collector.recorder import Recorder
    from kvtier.probes.vllm.recording import ManagerRecorder
    from kvtier.probes.vllm.spec import RecordingOffloadingManager

    keys = [make_offload_key(i.to_bytes(32, "big"), 0) for i in range(rounds * 4)]

    def workload(manager) -> float:
        ctx = ReqContext("bench")
        started = time.perf_counter()
        for r in range(rounds):
            batch = keys[r * 4:(r + 1) * 4]
            out = manager.prepare_store(batch, ctx)
            manager.complete_store(out.keys_to_store, ctx)
            manager.lookup(batch[0], ctx)
            manager.prepare_load(batch[:2], ctx)
            manager.complete_load(batch[:2], ctx)
        return time.perf_counter() - started

    def bare():
        return CPUOffloadingManager(num_chunks=64, cache_policy="lru")

    def wrapped(capacity_events=1 << 22):
        recorder = Recorder(Origin("vllm", "bench", "bench"), capacity_events=capacity_events)
        if capacity_events == 1:
            recorder.record(0, 0)  # now full
        return RecordingOffloadingManager(bare(), ManagerRecorder(recorder, chunk_bytes=4096))

    runs = {"bare": bare, "wrapped": wrapped, "full": lambda: wrapped(capacity_events=1)}
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(repeats):  # interleaved, so a busy moment hits all three
        for name, make in runs.items():
            best[name] = min(best[name], workload(make()))
    us = {name: seconds / rounds * 1e6 for name, seconds in best.items()}
    return {"spec_overhead_ratio": us["wrapped"] / us["bare"],
            "spec_bare_us_per_round": us["bare"], "spec_wrapped_us_per_round": us["wrapped"],
            "spec_recorder_full_us_per_round": us["full"]}


def spec_overhead_anywhere(smoke: bool) -> dict:
    try:
        return spec_overhead(**SMOKE_SPEC) if smoke else spec_overhead()
    except ImportError:
        pass
    from tests.probes.vllm.environments import VLLM_PYTHONS

    side = VLLM_PYTHONS["0.33"]
    if not Path(side).exists():
        return {"spec_overhead_ratio": None}
    done = subprocess.run([side, __file__, "--spec-only", *["--smoke"] * smoke], capture_output=True,
                          text=True, timeout=300, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    lines = [l for l in done.stdout.splitlines() if l.startswith("{")]
    return json.loads(lines[-1]) if lines else {"spec_overhead_ratio": None}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--frames", type=int, default=20_000, help="vLLM frames per run")
    parser.add_argument("--events-per-frame", type=int, default=50,
                        help="block events per frame (a multiple of 5)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per figure (best is kept)")
    parser.add_argument("--smoke", action="store_true", help="tiny inputs, seconds: checks the "
                        "benchmark runs (its figures mean nothing)")
    parser.add_argument("--spec-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.smoke:
        vars(args).update(SMOKE)
    if args.spec_only:
        print(json.dumps(spec_overhead(**SMOKE_SPEC) if args.smoke else spec_overhead()))
        return 0
    if args.events_per_frame < 5 or args.events_per_frame % 5:
        parser.error(f"--events-per-frame must be a positive multiple of 5, got {args.events_per_frame}")
    result = {**stream_figures(args.frames, args.events_per_frame, args.repeat),
              **{name: None if value is None else round(value, 3)
                 for name, value in spec_overhead_anywhere(args.smoke).items()},
              "frames": args.frames, "events_per_frame": args.events_per_frame}
    print(json.dumps(result) if args.json else "\n".join(f"{k}: {v}" for k, v in result.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
