"""The guardrail's real-engine scenario: one serving vLLM (kvtier's connector with a control
token and a 5 s lease, the slow-tier shim), traffic at concurrency 4, collectors in turn on
one store:

1. ``warm`` (a collector with its guardrail off): the engine's TTFT p99 sets the budget
   (three times it, at least 1 s: this host's TTFT spikes past half a second under others'
   load) and the slow tier's delay per load job (twice the budget);
2. ``observe``: a collector in observe mode (with the token, so only the mode holds it back);
   the delay is on until its rule has decided a pause (its ``/metrics`` sampled as soon as the
   decision shows, well within the pause's hold), and 5 s more (``observed``);
3. ``act``: a collector in act mode; the delay is on until the engine applied the pause and 5
   s more (``paused``), then off until the engine resumed and 3 s more (``recovered``);
4. ``queued``: a collector in act mode with link costs that price every load above its
   recompute: the engine recomputes each prefix the CPU tier holds (reason ``queue``);
5. a collector in act mode again, the delay on until the engine applied a pause; the
   collector is SIGKILLed; traffic goes on through the lease (``orphaned``) and after it
   (``released``), no collector;
6. ``restarted``: a collector without a token (the control endpoint is free), the delay off,
   while a hostile sender holds the control endpoint and sends garbage, forged and replayed
   messages and a flood.

Every phase ends with no request in flight, so its vLLM counter deltas and its store records
cover the same requests. What each phase saw is kept in :class:`GuardrailRun`.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.probes.vllm import guardrail_run as g
from tests.probes.vllm.serving import CollectorProcess, total

LEASE_S, HOLD_S, STEP_S, SUSTAINED_S = 5.0, 10.0, 0.5, 2


@dataclass
class GuardrailRun:
    store: Path
    budget_s: float = 0.0
    delay_s: float = 0.0
    window_s: int = 0
    phases: dict = field(default_factory=dict)  # name -> guardrail_run.Phase
    marks: dict = field(default_factory=dict)  # what happened when (Unix seconds)
    states: dict = field(default_factory=dict)  # the collectors' /guardrail pages
    samples: dict = field(default_factory=dict)  # the collectors' /metrics at named moments
    hostile_sent: dict = field(default_factory=dict)


def run_scenario(python: str, workdir: Path) -> GuardrailRun:
    hooks, control = g.endpoints()
    token_file = workdir / "control-token"
    token_file.write_text(g.TOKEN + "\n")
    engine = g.GuardedEngine(python, workdir, hooks, control, lease_s=LEASE_S)
    run = GuardrailRun(workdir / "kvtier.duckdb")
    collector = g.guardrail_collector(run.store, hooks, control, "off", 100.0, None)
    engine.server.start()
    try:
        collector.start()
        engine.server.wait_ready()
        traffic = g.Traffic(engine.server.url, str(engine.model))
        run.phases["warm"] = engine.phase(traffic, "warm", g.for_seconds(12))
        collector.stop()
        _size(run)
        collector = _collector(run, hooks, control, "observe", token_file)
        _observe(run, engine, traffic, collector)
        collector.stop()
        collector = _collector(run, hooks, control, "act", token_file)
        _act(run, engine, traffic, collector)
        collector.stop()
        collector = _collector(run, hooks, control, "act", token_file, _costs(workdir))
        _queued(run, engine, traffic, collector)
        collector.stop()
        collector = _collector(run, hooks, control, "act", token_file)
        _orphan(run, engine, traffic, collector)
        collector = _collector(run, hooks, control, "off", None)
        _hostile(run, engine, traffic, collector, control)
    finally:
        if collector.process is not None and collector.process.poll() is None:
            collector.stop()
        engine.server.stop()
    return run


def _size(run: GuardrailRun) -> None:
    import duckdb

    with duckdb.connect(str(run.store), read_only=True) as con:
        (p99,), = con.execute("SELECT quantile_cont(ttft_s, 0.99) FROM requests").fetchall()
    # well clear of the host's noise (a budget near it breaches on noise alone), and a slow
    # tier well clear of the budget (a loaded request waits twice the budget at least)
    run.budget_s = max(3 * p99, 1.0)
    run.delay_s = 2 * run.budget_s
    run.window_s = max(3, math.ceil(2 * run.delay_s))  # a window outlasts a slow step


def _collector(run, hooks, control, mode, token_file, costs=None) -> CollectorProcess:
    return g.guardrail_collector(run.store, hooks, control, mode, run.budget_s, token_file,
                                 window_s=run.window_s, sustained_s=SUSTAINED_S, step_s=STEP_S,
                                 hold_s=HOLD_S, costs=costs).start()


def _costs(workdir: Path) -> Path:
    """Link costs that make every load wait longer than its recompute: a 64 KiB chunk takes
    65 ms over a 1 MB/s link, its 32 tokens recompute in 32 us (given, not calibrated: this
    host's link is fast)."""
    import json

    path = workdir / "slow-link.json"
    path.write_text(json.dumps({"probe": "calibrate", "cost_params": {
        "cpu_gpu_bandwidth_bytes_per_s": 1e6, "cpu_gpu_op_latency_s": 0.01,
        "prefill_tokens_per_s": 1e6}}))
    return path


def _moves(collector, actor: str, action: str) -> list[dict]:
    return [m for m in g.guardrail_state(collector).get("moves", [])
            if m["actor"] == actor and m["action"] == action]


def _when(run: GuardrailRun, mark: str, happened, then_s: float):
    """``until`` for a phase: once ``happened()`` is true (noted as ``mark``), ``then_s`` more."""
    def until() -> bool:
        if mark not in run.marks and happened():
            run.marks[mark] = time.time()
        return mark in run.marks and time.time() - run.marks[mark] >= then_s
    return until


def _reconnected(engine, traffic) -> None:
    """Unmeasured traffic while the engine's shipper reconnects to a new collector (what it
    ships before is dropped and counted, as with no collector)."""
    engine.phase(traffic, "reconnect", g.for_seconds(2.0))


def _observe(run, engine, traffic, collector) -> None:
    _reconnected(engine, traffic)
    engine.set_delay(run.delay_s)
    run.marks["observe_delay_on"] = time.time()
    def decided() -> bool:  # what the collector exports while its decision holds
        if not _moves(collector, "rule", "pause"):
            return False
        run.samples.setdefault("observe_decided", collector.samples())
        return True

    run.phases["observe"] = engine.phase(traffic, "observe", _when(run, "observe_decided", decided, 0.0))
    run.phases["observed"] = engine.phase(traffic, "observed", g.for_seconds(5.0))
    engine.set_delay(0.0)
    run.states["observe"] = g.guardrail_state(collector)
    run.samples["observe"] = collector.samples()


def _act(run, engine, traffic, collector) -> None:
    engine.phase(traffic, "act-clean", g.for_seconds(run.window_s + 1))  # slow answers age out
    engine.set_delay(run.delay_s)
    run.marks["act_delay_on"] = time.time()
    run.phases["paused"] = engine.phase(traffic, "paused", _when(
        run, "act_engine_paused", lambda: _moves(collector, "engine", "pause"), 5.0))
    engine.set_delay(0.0)
    run.marks["act_delay_off"] = time.time()
    run.phases["recovered"] = engine.phase(traffic, "recovered", _when(
        run, "act_engine_resumed", lambda: _moves(collector, "engine", "resume"), 3.0))
    run.states["act"] = g.guardrail_state(collector)
    run.samples["act"] = collector.samples()


def _queued(run, engine, traffic, collector) -> None:
    """Act mode with link costs: the engine recomputes what it would wait longer to load."""
    def applied() -> bool:  # the collector's state reached the engine: nothing paused, costs on
        state = g.guardrail_state(collector)
        return not state.get("engine_paused", [1]) and state.get("fallbacks", {}).get("queue")

    engine.phase(traffic, "queued-clean", _when(run, "queued_applied", applied, 1.0), 60)
    run.phases["queued"] = engine.phase(traffic, "queued", g.for_seconds(6.0))
    run.samples["queued"] = collector.samples()


def _orphan(run, engine, traffic, collector) -> None:
    engine.phase(traffic, "orphan-clean", g.for_seconds(run.window_s + 1))
    engine.set_delay(run.delay_s)
    before = len(_moves(collector, "engine", "pause"))
    engine.phase(traffic, "orphan-slow", lambda: len(_moves(collector, "engine", "pause")) > before)
    collector.kill()
    run.marks["killed"] = time.time()
    # the lease runs from the last heartbeat (at most 1 s before the kill): the phase ends well
    # before it, its last requests included
    run.phases["orphaned"] = engine.phase(traffic, "orphaned", g.for_seconds(LEASE_S - 2.5))
    time.sleep(max(0.0, run.marks["killed"] + LEASE_S + 1.0 - time.time()))
    run.phases["released"] = engine.phase(traffic, "released", g.for_seconds(6.0))
    engine.set_delay(0.0)


def _hostile(run, engine, traffic, collector, control: str) -> None:
    _reconnected(engine, traffic)
    sender = threading.Thread(target=_attack, args=(run, control), daemon=True)
    sender.start()
    run.phases["restarted"] = engine.phase(traffic, "restarted", g.for_seconds(8.0))
    sender.join(30)
    time.sleep(1.0)  # the last batch carries the engine's count
    run.samples["restarted"] = collector.samples()


def _attack(run: GuardrailRun, control: str) -> None:
    """Whoever holds the control endpoint: garbage, a forged command, a replayed genuine one
    (issued an hour ago), then a flood of forged pauses."""
    import zmq

    from kvtier.collector.control import Command, encode

    context = zmq.Context()
    hostile = context.socket(zmq.PUB)
    hostile.bind(control)
    pause = frozenset({("loads", "cpu"), ("stores", "cpu")})
    forged = encode(Command(g.INSTANCE, 2**40, 1, time.time(), pause), b"a-guessed-token-0123456789")
    replayed = encode(Command(g.INSTANCE, 2**40, 2, time.time() - 3600, pause), g.TOKEN.encode())
    try:
        time.sleep(1.0)  # the engine's SUB socket connects and subscribes
        for frames in ([b"\x00garbage"], [b"{}"], forged, replayed):
            for _ in range(5):
                hostile.send_multipart(frames)
        sent = 0
        flood_until = time.monotonic() + 2.0
        while time.monotonic() < flood_until:
            hostile.send_multipart(forged)
            sent += 1
        run.hostile_sent = {"garbage": 10, "forged": 5 + sent, "replayed": 5}
    finally:
        hostile.close(linger=0)
        context.term()


def engine_rejected(samples: dict) -> dict:
    """The engine's count of dropped control messages, by reason, as the collector exports it."""
    return {dict(labels)["reason"]: value for (name, labels), value in samples.items()
            if name == "kvtier_guardrail_rejected_messages_total"
            and dict(labels).get("engine_instance") == g.INSTANCE}


def metric(samples: dict, name: str, **labels) -> float:
    return total(samples, name, engine_instance=g.INSTANCE, **labels)
