"""Benchmark driver, run in a vLLM environment: kvtier's manager wrapper around vLLM's real
``CPUOffloadingManager``, driven at a fixed rate of block events, its recorder shipped by the
engine-side shipper to a collector (``kvtier collect --hooks``). Prints one JSON line: events
recorded per second, and the recorder's and shipper's drops.

Usage: python hook_rate.py ENDPOINT EVENTS_PER_S SECONDS
"""

from __future__ import annotations

import json
import sys
import time


def main(endpoint: str, rate: float, seconds: float) -> dict:
    from vllm.v1.kv_offload.base import ReqContext, make_offload_key
    from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

    from collector import shipper
    from probes.vllm.hook_settings import HookSettings
    from probes.vllm.recorders import recorder_for
    from probes.vllm.recording import ManagerRecorder
    from probes.vllm.spec import RecordingOffloadingManager

    settings = HookSettings.from_extra_config({"kvtier_collector": endpoint,
                                               "kvtier_instance": "rate-bench"})
    recorder = recorder_for("rate-bench", settings)
    manager = RecordingOffloadingManager(CPUOffloadingManager(num_chunks=4096, enable_events=True),
                                         ManagerRecorder(recorder, chunk_bytes=65536))
    time.sleep(0.5)  # the shipper connects
    chunk, n, began = 16, 0, time.perf_counter()
    # one request per round: store 16 new chunks (evicting old ones once full), load 8 back
    while (elapsed := time.perf_counter() - began) < seconds:
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


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], float(sys.argv[2]), float(sys.argv[3]))))
