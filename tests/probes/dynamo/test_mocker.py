"""kvtier against NVIDIA Dynamo 1.6.1's mocker, a live engine without a GPU (marker ``peer``).

The mocker schedules and caches as a vLLM worker does (64 GPU blocks of 16 tokens here) and
publishes its KV events on ZMQ in vLLM's wire format; Dynamo's frontend serves the OpenAI API
in front of it. ``kvtier collect --dynamo-events`` stores the events and ``--scrape`` the
worker's and the frontend's Prometheus pages. Oracles: the frames a plain ZMQ subscriber in
this test decodes itself, the worker's own count of the events it published, and what the
official ``openai`` client was told.

Needs the environment ``scripts/dynamo-env.sh`` builds (``$KVTIER_DYNAMO_PYTHON``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import duckdb
import pytest

from tests.conftest import free_port
from tests.probes.dynamo.model_folder import WORDS, build
from tests.probes.peers import PeerProcess, peer_python

pytestmark = [pytest.mark.peer, pytest.mark.timeout(300)]

GPU_BLOCKS, BLOCK_TOKENS = 64, 16
PREFIXES, TURNS, PREFIX_WORDS = 6, 2, 250  # 6 prefixes of 15 full blocks: more than 64 blocks


class FrameLog:
    """The oracle: a ZMQ subscriber of the mocker's KV events, decoding with msgpack alone."""

    def __init__(self, endpoint: str):
        import zmq

        self.stored: list[int] = []
        self.removed: list[int] = []
        self.stored_events = 0
        self._socket = zmq.Context.instance().socket(zmq.SUB)
        self._socket.setsockopt(zmq.SUBSCRIBE, b"")
        self._socket.connect(endpoint)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import msgpack

        while not self._stop.is_set():
            if not self._socket.poll(100):
                continue
            _topic, _seq, payload = self._socket.recv_multipart()
            _ts, events, _rank = msgpack.unpackb(payload)
            for event in events:
                if event["type"] == "BlockStored":
                    self.stored_events += 1
                    self.stored.extend(event["block_hashes"])
                elif event["type"] == "BlockRemoved":
                    self.removed.extend(event["block_hashes"])

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._socket.close(linger=0)


@pytest.fixture
def dynamo(tmp_path):
    """A running mocker and frontend: (frontend URL, system metrics URL, events endpoint)."""
    python = peer_python("KVTIER_DYNAMO_PYTHON", ".venv-dynamo/.ready")
    model, discovery = build(tmp_path / "model"), tmp_path / "discovery"
    discovery.mkdir()
    system, events, http = free_port(), free_port(), free_port()  # Dynamo names no port it picked
    env = {"DYN_FILE_KV": str(discovery)}
    plane = ["--discovery-backend", "file", "--request-plane", "tcp", "--event-plane", "zmq"]
    mocker = PeerProcess(
        [str(python), "-m", "dynamo.mocker", "--model-path", str(model), "--model-name", "tiny",
         *plane, "--zmq-kv-events-ports", str(events),
         "--num-gpu-blocks-override", str(GPU_BLOCKS), "--block-size", str(BLOCK_TOKENS),
         "--num-host-blocks", "128", "--speedup-ratio", "10"],
        tmp_path / "mocker.log",
        env={**env, "DYN_SYSTEM_PORT": str(system), "DYN_SYSTEM_ENABLED": "true"})
    frontend = PeerProcess([str(python), "-m", "dynamo.frontend", "--http-port", str(http), *plane],
                           tmp_path / "frontend.log", env=env)
    try:
        url = f"http://127.0.0.1:{http}"
        deadline = time.monotonic() + 120
        while b'"tiny"' not in frontend.wait_http(url + "/v1/models"):
            if time.monotonic() > deadline:
                pytest.fail(f"the frontend never listed the mocker's model:\n{mocker.tail()}")
            time.sleep(0.5)
        mocker.wait_http(f"http://127.0.0.1:{system}/metrics")
        yield url, f"http://127.0.0.1:{system}/metrics", f"tcp://127.0.0.1:{events}"
    finally:
        frontend.stop()
        mocker.stop()


def test_collect_stores_the_mockers_kv_events_and_dynamos_metrics(dynamo, tmp_path):
    import openai

    frontend, system_metrics, events = dynamo
    store = tmp_path / "kvtier.duckdb"
    collector = subprocess.Popen(
        [sys.executable, "-m", "kvtier", "collect", "--store", str(store), "--metrics-port", "0",
         "--instance", "mocker-0", "--dynamo-events", events,
         "--scrape", f"{system_metrics}=dynamo", "--scrape", f"{frontend}/metrics=dynamo",
         "--scrape-interval-s", "0.5", "--stop-grace-s", "10"],
        stdout=subprocess.PIPE, text=True)
    oracle = FrameLog(events)
    try:
        started = 0
        for line in collector.stdout:
            started += "kvtier collect: tap " in line
            if started == 3:
                break
        time.sleep(2.0)  # both subscribers joined, each page's baseline scraped
        client = openai.OpenAI(base_url=frontend + "/v1", api_key="unused", max_retries=0)
        cached = []
        for turn in range(TURNS):
            for p in range(PREFIXES):
                prefix = " ".join(WORDS[p * 300:p * 300 + PREFIX_WORDS])
                answer = client.completions.create(model="tiny", max_tokens=8,
                                                   prompt=f"{prefix} {WORDS[1900 + turn]}")
                cached.append(answer.usage.prompt_tokens_details.cached_tokens or 0)
        time.sleep(2.0)  # the last events arrive and each page is scraped again
        collector.send_signal(signal.SIGINT)
        out, _ = collector.communicate(timeout=60)
    finally:
        oracle.close()
        if collector.poll() is None:
            collector.kill()
    assert collector.returncode == 0, out

    con = duckdb.connect(str(store), read_only=True)
    try:
        origins = con.execute("SELECT engine, instance, count(*) FROM block_events_with_origin "
                              "GROUP BY ALL").fetchall()
        # in the order stored (a frame's removals come before its stores, at one time_s)
        rows = con.execute("SELECT kind, block_hash, tier_to, tier_from FROM block_events "
                           "ORDER BY rowid").fetchall()
        counter = lambda metric, *labels: con.execute(
            "SELECT coalesce(sum(value), 0) FROM metric_intervals_with_origin WHERE "
            "engine = 'dynamo' AND metric = ?" + " AND labels LIKE ?" * len(labels),
            [metric, *(f"%{label}%" for label in labels)]).fetchone()[0]
        published = counter("dynamo_component_kv_publisher_zmq_events_total",
                            'event_type="stored"', 'stage="received"')
        requests = counter("dynamo_component_requests_total", 'dynamo_endpoint="generate"')
        cached_sum = con.execute(
            "SELECT coalesce(sum(sum_value), 0) FROM metric_intervals_with_origin WHERE "
            "engine = 'dynamo' AND metric = 'dynamo_frontend_cached_tokens' "
            "AND kind = 'histogram'").fetchone()[0]
    finally:
        con.close()

    assert origins == [("dynamo", "mocker-0", len(rows))]
    stored = [h for kind, h, *_ in rows if kind == "store"]
    removed = [h for kind, h, *_ in rows if kind == "evict"]
    # every frame the mocker published reached the store, block for block
    assert Counter(stored) == Counter(oracle.stored) and Counter(removed) == Counter(oracle.removed)
    assert len(stored) > 0 and len(removed) > 0  # more prefixes than GPU blocks: evictions
    assert {(to, frm) for kind, _h, to, frm in rows if kind == "store"} == {("gpu", None)}
    # a removal names a block stored before it; the GPU never holds more than its blocks
    live: set[int] = set()
    for kind, block, *_ in rows:
        if kind == "store":
            live.add(block)
        else:
            assert block in live, f"block {block} removed before it was stored"
            live.discard(block)
        assert len(live) <= GPU_BLOCKS
    # the scraped intervals add up to what Dynamo counted and told the client
    assert published == oracle.stored_events > 0
    assert requests == PREFIXES * TURNS
    assert cached_sum == sum(cached) > 0
