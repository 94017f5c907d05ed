"""kvtier's guardrail in the collector, on a hand-moved clock: the rule over ingested request
records per instance, its decisions stored as tier moves and exported, and in act mode sent
through a real control channel to a real engine-side receiver; an operator's command over the
collector's HTTP port, signed."""

from __future__ import annotations

import time
import urllib.error

import pytest

from kvtier.collector.batch import EventBatch
from kvtier.collector.control_receiver import ControlReceiver, ReceiverConfig
from kvtier.collector.control_sender import ControlSender
from kvtier.collector.events import Origin, RequestRecord
from kvtier.collector.exports.aggregate import MetricsState
from kvtier.collector.exports.prometheus import KvtierCollector, MetricsServer
from kvtier.errors import KvtierError
from kvtier.guardrail.client import GuardrailClient
from kvtier.guardrail.watch import Guardrail, GuardrailConfig
from kvtier.policy.rollback.live_rule import GuardrailSettings
from kvtier.policy.rollback.rule import LatencyBudget
from tests.conftest import free_port

TOKEN = b"collector-and-engines-share-this!"
BUDGET = LatencyBudget(ttft_p99_s=1.0, itl_p99_s=0.5, sustained_s=3, window_s=4)
ENGINE = Origin("vllm", "node-7", "vllm-hooks:node-7:e0:1")
CONFIGURED = "gpu+cpu:8388608"


def settings(mode: str) -> GuardrailSettings:
    return GuardrailSettings(mode, BUDGET, step_s=1.0, hold_s=5.0, max_hold_s=20.0)


class Engine:
    """Requests as an engine ships them: each finishes at the clock's time."""

    def __init__(self, clock):
        self.clock, self.sequence = clock, 0

    def batch(self, ttft_s: float, n: int = 4, label: str = CONFIGURED, **fields) -> EventBatch:
        now = self.clock()
        records = [RequestRecord(f"r{self.sequence}-{i}", now - ttft_s - 0.01, 512, ttft_s=ttft_s,
                                 itl_s=0.01, e2e_latency_s=ttft_s + 0.01, tier_config_id=label,
                                 **fields) for i in range(n)]
        self.sequence += 1
        return EventBatch.from_rows(ENGINE, self.sequence, requests=records)


def drive(guardrail, engine, clock, seconds: int, ttft_s: float, **fields) -> list:
    """One batch of requests and one evaluation a second; the moves made."""
    made = []
    for _ in range(seconds):
        clock.advance(1.0)
        guardrail.observe(engine.batch(ttft_s, **fields))
        made += guardrail.evaluate()
    return made


def stored(store) -> list[dict]:
    return store.query("SELECT actor, action, direction, tier, mode, reason, tier_config_id, "
                       "command FROM tier_moves_with_origin WHERE instance = 'node-7' "
                       "ORDER BY time_s").to_pylist()


def test_observe_decides_records_and_exports_but_sends_nothing(clock, store):
    guardrail = Guardrail(GuardrailConfig(settings("observe")), clock=clock)
    guardrail.start(store.ingest)
    engine = Engine(clock)
    try:
        assert drive(guardrail, engine, clock, 5, 0.3) == []
        (pause,) = drive(guardrail, engine, clock, 8, 2.0)
    finally:
        guardrail.stop()
    assert (pause.action, pause.mode, pause.command) == ("pause", "observe", None)
    assert stored(store) == [{"actor": "rule", "action": "pause", "direction": "loads",
                              "tier": "cpu", "mode": "observe", "reason": "ttft_p99_over_budget",
                              "tier_config_id": CONFIGURED + ";paused=loads:cpu", "command": None}]
    samples = {(s.name, s.labels.get("direction"), s.labels.get("actor"), s.labels.get("metric")):
               s.value for s in guardrail.samples()}
    assert samples[("kvtier_guardrail_state", "loads", None, None)] == 1
    assert samples[("kvtier_guardrail_actions_total", "loads", "rule", None)] == 1
    assert samples[("kvtier_guardrail_window_p99_seconds", None, None, "ttft")] == pytest.approx(2.0)


def test_requests_from_a_load_probe_and_the_guardrails_own_batches_are_not_the_engines(clock):
    guardrail = Guardrail(GuardrailConfig(settings("observe")), clock=clock)
    record = RequestRecord("c1", clock() - 1, 64, ttft_s=9.0, e2e_latency_s=1.0)
    guardrail.observe(EventBatch.from_rows(Origin("load-probe", "node-7", "probe:1"), 0, requests=[record]))
    guardrail.observe(EventBatch.from_rows(Origin("vllm", "node-7", "kvtier-guardrail:node-7:1"), 0,
                                           requests=[record]))
    assert guardrail.instances() == []


def receiver(endpoint: str) -> ControlReceiver:
    return ControlReceiver(ReceiverConfig("node-7", TOKEN, endpoint, lease_s=30.0))


def wait_for(receiver: ControlReceiver, predicate, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        receiver.poll(0.05)
        if predicate(receiver.state):
            return True
    return False


def test_act_sends_the_pause_and_the_resume_to_the_engine_and_counts_its_fallbacks(clock, store):
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    sender = ControlSender(TOKEN, endpoint, heartbeat_s=0.05)
    guardrail = Guardrail(GuardrailConfig(settings("act")), sender, clock=clock)
    guardrail.start(store.ingest)
    engine, inside = Engine(clock), receiver(endpoint)
    try:
        drive(guardrail, engine, clock, 3, 0.3)
        assert wait_for(inside, lambda s: s.act and not s.paused)  # act: every instance hears
        (pause,) = drive(guardrail, engine, clock, 8, 2.0)
        assert wait_for(inside, lambda s: s.paused == {("loads", "cpu")})
        assert inside.state.command >= pause.command
        # the engine recomputes: fast again, and its records say why
        made = drive(guardrail, engine, clock, 12, 0.2, label=CONFIGURED + ";paused=loads:cpu",
                     fallback_reason="paused", fallback_tokens=256)
        assert [m.action for m in made] == ["resume"]
        assert wait_for(inside, lambda s: not s.paused)
    finally:
        guardrail.stop()
        inside.close()
    assert [(m["actor"], m["action"], m["mode"]) for m in stored(store)] == [
        ("rule", "pause", "act"), ("rule", "resume", "act")]
    assert all(m["command"] is not None for m in stored(store))
    samples = {(s.name, s.labels.get("reason")): s.value for s in guardrail.samples()}
    assert samples[("kvtier_guardrail_fallbacks_total", "paused")] == 12 * 4
    assert samples[("kvtier_guardrail_fallback_tokens_total", "paused")] == 12 * 4 * 256


def test_act_needs_a_channel():
    with pytest.raises(ValueError, match="act mode needs the control channel"):
        Guardrail(GuardrailConfig(settings("act")))


@pytest.fixture
def served(clock, store):
    """A guardrail in observe mode with a channel, behind a real HTTP server, with one
    instance known; the engine's receiver."""
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    guardrail = Guardrail(GuardrailConfig(settings("observe")),
                          ControlSender(TOKEN, endpoint, heartbeat_s=0.05))
    guardrail.start(store.ingest)
    guardrail.observe(Engine(clock).batch(0.3))
    server = MetricsServer(KvtierCollector(MetricsState()), routes=guardrail.routes(TOKEN))
    inside = receiver(endpoint)
    yield GuardrailClient(server.url.removesuffix("/metrics")), inside
    server.close()
    guardrail.stop()
    inside.close()


def test_an_operator_pauses_and_resumes_through_the_same_channel(served, store):
    client, inside = served
    answer = client.command(TOKEN, "pause", "node-7", ("loads", "stores"), None)
    assert answer["tier_config"] == CONFIGURED + ";paused=loads:cpu,stores:cpu"
    assert wait_for(inside, lambda s: s.paused == {("loads", "cpu"), ("stores", "cpu")})
    status = client.status()
    (instance,) = status["instances"]
    assert instance["operator_hold"] and instance["paused"] == [["loads", "cpu"], ["stores", "cpu"]]
    client.command(TOKEN, "resume", "node-7", ("loads", "stores"), None)
    assert wait_for(inside, lambda s: not s.paused)
    assert [(m["actor"], m["action"], m["direction"]) for m in stored(store)] == [
        ("operator", "pause", "loads"), ("operator", "pause", "stores"),
        ("operator", "resume", "loads"), ("operator", "resume", "stores")]


def test_an_operator_command_signed_otherwise_or_for_nobody_is_refused(served):
    client, inside = served
    with pytest.raises(KvtierError, match="MAC does not match") as refused:
        client.command(b"someone-elses-token-0123456789ab", "pause", "node-7", ("loads",), None)
    assert refused.value.exit_code == 2
    with pytest.raises(KvtierError, match="no instance 'node-9'.*known: node-7"):
        client.command(TOKEN, "pause", "node-9", ("loads",), None)
    assert not wait_for(inside, lambda s: s.paused, 0.5)


def test_a_replayed_operator_command_is_refused(served):
    client, _ = served
    from kvtier.guardrail.operator import MAC_HEADER, OperatorCommand
    import urllib.request

    body, mac = OperatorCommand("pause", "node-7", ("loads",), None, time.time(), "n1").signed(TOKEN)
    request = lambda: urllib.request.Request(client.url, body, {MAC_HEADER: mac}, method="POST")
    urllib.request.urlopen(request(), timeout=5).read()
    with pytest.raises(urllib.error.HTTPError) as again:
        urllib.request.urlopen(request(), timeout=5)
    assert again.value.code == 409


def test_the_verb_shows_the_state_and_pauses_by_hand(served, tmp_path, capsys):
    from kvtier.cli import main

    client, inside = served
    base = client.url.removesuffix("/guardrail")
    token = tmp_path / "token"
    token.write_text(TOKEN.decode() + "\n")
    assert main(["guardrail", "pause", "--instance", "node-7", "--stores", "--token-file",
                 str(token), "--collector", base]) == 0
    assert "now carry gpu+cpu:8388608;paused=stores:cpu" in capsys.readouterr().out
    assert wait_for(inside, lambda s: s.paused == {("stores", "cpu")})
    assert main(["guardrail", "status", "--collector", base + "/metrics"]) == 0
    out = capsys.readouterr().out
    assert "guardrail observe: p99 TTFT <= 1 s, ITL <= 0.5 s over 4 s windows, sustained 3 s" in out
    assert "holds paused: stores from cpu (operator)" in out
    assert "operator pause  stores cpu  (operator" in out
    assert main(["guardrail", "status", "--json", "--collector", base]) == 0
    assert '"operator_hold": true' in capsys.readouterr().out
