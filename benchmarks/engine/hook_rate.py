"""Benchmark driver, run in a vLLM environment: kvtier's manager wrapper around vLLM's real
``CPUOffloadingManager``, driven at a fixed rate of block events, its recorder shipped by the
engine-side shipper to a collector (``kvtier collect --hooks``). Prints one JSON line: events
recorded per second, and the recorder's and shipper's drops.

Usage: python hook_rate.py ENDPOINT EVENTS_PER_S SECONDS
       python hook_rate.py ENDPOINT cost ROUNDS   (bare manager vs kvtier's wrapper, CPU time)
"""

from __future__ import annotations

import json
import sys
import time


def main(endpoint: str, rate: float, seconds: float) -> dict:
    from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

    from kvtier.collector import shipper
    from kvtier.probes.vllm.hook_settings import HookSettings
    from kvtier.probes.vllm.recorders import recorder_for
    from kvtier.probes.vllm.recording import ManagerRecorder
    from kvtier.probes.vllm.spec import RecordingOffloadingManager

    settings = HookSettings.from_extra_config({"kvtier_collector": endpoint,
                                               "kvtier_instance": "rate-bench"})
    recorder = recorder_for("rate-bench", settings)
    manager = RecordingOffloadingManager(CPUOffloadingManager(num_chunks=4096, enable_events=True),
                                         ManagerRecorder(recorder, chunk_bytes=65536))
    time.sleep(0.5)  # the shipper connects
    chunk, n, began = 16, 0, time.perf_counter()
    # one request per round: store 16 new chunks (evicting old ones once full), load 8 back
    while (elapsed := time.perf_counter() - began) < seconds:
        one_round(manager, n, chunk)
        n += 1
        ahead = (n * 40) / rate - elapsed  # ~40 events a round (16 stores, ~16 evictions, 8 loads)
        if ahead > 0:
            time.sleep(ahead)
    elapsed = time.perf_counter() - began
    ship = shipper._SHIPPERS[endpoint]
    shipper.flush_all(5.0)
    (stream,) = ship._streams
    events = stream.sent_events + stream.dropped_events + recorder.dropped_events
    return {"rounds": n, "seconds": elapsed, "events": events, "events_per_s": events / elapsed,
            "events_sent": stream.sent_events,
            "recorder_dropped_events": recorder.dropped_events,
            "shipper_dropped_events": stream.dropped_events, "batches_sent": ship.batches_sent,
            "batches_dropped": ship.batches_dropped}


def one_round(manager, n: int, chunk: int = 16) -> None:
    from vllm.v1.kv_offload.base import ReqContext, make_offload_key

    ctx = ReqContext(f"r{n}")
    manager.on_new_request(ctx)
    keys = [make_offload_key((n * chunk + i).to_bytes(32, "big"), 0) for i in range(chunk)]
    out = manager.prepare_store(keys, ctx)
    if out is not None:
        manager.complete_store(out.keys_to_store, ctx)
    back = keys[: chunk // 2]
    manager.prepare_load(back, ctx)
    manager.complete_load(back, ctx)
    manager.take_events()
    manager.on_request_finished(ctx)


def cost(endpoint: str, rounds: int, block: int = 500) -> dict:
    """Process CPU time per round, bare vs wrapped, in alternating blocks of rounds."""
    from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

    from kvtier.collector import shipper
    from kvtier.probes.vllm.hook_settings import HookSettings
    from kvtier.probes.vllm.recorders import recorder_for
    from kvtier.probes.vllm.recording import ManagerRecorder
    from kvtier.probes.vllm.spec import RecordingOffloadingManager

    recorder = recorder_for("cost-bench", HookSettings.from_extra_config({"kvtier_collector": endpoint}))
    bare = CPUOffloadingManager(num_chunks=4096, enable_events=True)
    wrapped = RecordingOffloadingManager(CPUOffloadingManager(num_chunks=4096, enable_events=True),
                                         ManagerRecorder(recorder, chunk_bytes=65536))
    time.sleep(0.5)
    spent = {"bare": 0.0, "wrapped": 0.0}
    done = {"bare": 0, "wrapped": 0}
    n = 0
    while done["wrapped"] < rounds:
        for name, manager in (("bare", bare), ("wrapped", wrapped)):
            began = time.process_time()  # the shipper thread's CPU counts too: same process
            for _ in range(block):
                one_round(manager, n)
                n += 1
            spent[name] += time.process_time() - began
            done[name] += block
    shipper.flush_all(5.0)
    raw, ours = (spent[k] / done[k] * 1e6 for k in ("bare", "wrapped"))
    return {"rounds": rounds, "raw_us_per_round": raw, "wrapped_us_per_round": ours,
            "extra_us_per_round": ours - raw, "calls_per_round": 8}


if __name__ == "__main__":
    if sys.argv[2] == "cost":
        print(json.dumps(cost(sys.argv[1], int(sys.argv[3]))))
    else:
        print(json.dumps(main(sys.argv[1], float(sys.argv[2]), float(sys.argv[3]))))
