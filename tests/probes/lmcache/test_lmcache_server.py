"""kvtier against LMCache 0.5.6's own multi-process cache server on the CPU (marker ``peer``).

The server is driven by LMCache's bench client (CPU KV tensors, server-driven transfers), so
each sequence is looked up cold, stored, then looked up warm. ``kvtier collect --scrape``
stores the server's Prometheus page; its lookup counters' intervals must add up to what the
page says. The server's lookup-hash log is read as a trace (``--format lmcache``) and
kvtier's GPU-only LRU replay of it must give the hits LMCache's own cache simulator gives
(and, with room for every chunk, the hits the server itself counted).

Needs the environment ``scripts/lmcache-env.sh`` builds (``$KVTIER_LMCACHE_PYTHON``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import duckdb
import pytest

from tests.conftest import free_port
from tests.probes.peers import PeerProcess, peer_python

pytestmark = [pytest.mark.peer, pytest.mark.timeout(600)]

CHUNK_TOKENS, LOOKUP_TOKENS = 256, 1024
CHUNK_BYTES = 1 << 20  # the what-if's bytes per chunk: capacities are whole chunks
COUNTERS = ("lmcache_mp_lookup_requested_tokens_total", "lmcache_mp_lookup_hit_tokens_total",
            "lmcache_mp_lookup_hit_l1_tokens_total", "lmcache_mp_lookup_hit_l2_tokens_total",
            "lmcache_mp_lookups_requests_total", "lmcache_mp_l1_write_chunks_total",
            "lmcache_mp_l1_read_chunks_total")
QUIET = {**os.environ, "LMCACHE_DISABLE_BANNER": "1"}


class LmcacheServer:
    def __init__(self, python: Path, folder: Path):
        self.bin = python.parent
        # LMCache's server binds the ports it is given and names none it picked
        self.port, self.http_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.http_port}"
        self.hash_log = folder / "lookup-hashes"
        self.process = PeerProcess(
            [str(self.bin / "lmcache"), "server", "--l1-size-gb", "1", "--eviction-policy", "LRU",
             "--port", str(self.port), "--http-port", str(self.http_port),
             "--chunk-size", str(CHUNK_TOKENS), "--trace-level", "storage",
             "--trace-output", str(folder / "trace.lct"),
             "--lookup-hash-log-dir", str(self.hash_log)],
            folder / "server.log", env=QUIET)

    def bench(self, start: int, end: int) -> None:
        """LMCache's bench client: sequences ``start``..``end - 1``, each looked up cold and
        warm (a small KV layout keeps its shared memory small)."""
        done = subprocess.run(
            [str(self.bin / "lmcache"), "bench", "server", "--rpc-url",
             f"tcp://127.0.0.1:{self.port}", "--url", self.url, "--mode", "cpu",
             "--transfer-mode", "lmcache_driven", "--num-tokens", str(LOOKUP_TOKENS),
             "--kvcache-shape-spec", "(2,256,16,2,64):float16:2", "--interval", "0.05",
             "--start", str(start), "--end", str(end), "-q"],
            capture_output=True, text=True, timeout=300, env=QUIET)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    def counters(self) -> dict[str, float]:
        """The lookup counters on the server's page, summed over their series."""
        from prometheus_client.parser import text_string_to_metric_families

        with urllib.request.urlopen(self.url + "/metrics", timeout=10) as answer:
            text = answer.read().decode()
        totals = dict.fromkeys(COUNTERS, 0.0)
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name in totals:
                    totals[sample.name] += sample.value
        return totals


@pytest.fixture(scope="module")
def lmcache(tmp_path_factory):
    python = peer_python("KVTIER_LMCACHE_PYTHON", ".venv-lmcache/.ready")
    server = LmcacheServer(python, tmp_path_factory.mktemp("lmcache"))
    try:
        server.process.wait_http(server.url + "/metrics", timeout_s=180)
        yield server
    finally:
        server.process.stop()


def test_collect_scrape_stores_the_servers_lookup_counters(lmcache, tmp_path):
    store = tmp_path / "kvtier.duckdb"
    collector = subprocess.Popen(
        [sys.executable, "-m", "kvtier", "collect", "--store", str(store), "--metrics-port", "0",
         "--instance", "lmcache-0", "--scrape", f"{lmcache.url}/metrics=lmcache",
         "--scrape-interval-s", "0.5", "--stop-grace-s", "10"],
        stdout=subprocess.PIPE, text=True)
    try:
        for line in collector.stdout:
            if "tap ScrapeTap started" in line:
                break
        time.sleep(1.5)  # the collector's baseline scrape
        before = lmcache.counters()
        lmcache.bench(0, 6)
        time.sleep(1.5)  # a scrape after the last lookup
        after = lmcache.counters()
        collector.send_signal(signal.SIGINT)
        out, _ = collector.communicate(timeout=60)
    finally:
        if collector.poll() is None:
            collector.kill()
    assert collector.returncode == 0, out
    con = duckdb.connect(str(store), read_only=True)
    try:
        stored = dict(con.execute(
            "SELECT metric, sum(value) FROM metric_intervals_with_origin WHERE engine = 'lmcache' "
            "AND instance = 'lmcache-0' AND kind = 'counter' GROUP BY metric").fetchall())
    finally:
        con.close()
    grew = {name: after[name] - before[name] for name in COUNTERS}
    assert grew["lmcache_mp_lookups_requests_total"] == 12  # 6 sequences, cold and warm
    assert grew["lmcache_mp_lookup_requested_tokens_total"] == 12 * LOOKUP_TOKENS
    assert grew["lmcache_mp_lookup_hit_tokens_total"] >= 6 * LOOKUP_TOKENS  # every warm one
    assert grew["lmcache_mp_l1_write_chunks_total"] > 0
    assert {name: stored.get(name, 0.0) for name in COUNTERS} == grew


SIMULATE = """
import json, sys
from pathlib import Path
from lmcache.tools.cache_simulator.simulator import load_lookup_events, simulate
events = load_lookup_events([Path(sys.argv[1])])
result = simulate(events, int(sys.argv[2]), int(sys.argv[3]), fast=True)
print(json.dumps({k: v for k, v in result.items() if isinstance(v, (int, float))}))
"""


def lmcache_simulator(lmcache, chunks: int) -> dict:
    """LMCache's own what-if (``lmcache tool cache-simulator simulate`` without its chart,
    which needs matplotlib): its log loader and LRU replay at ``chunks`` chunks."""
    done = subprocess.run(
        [str(lmcache.bin / "python"), "-c", SIMULATE, str(lmcache.hash_log),
         str(chunks * CHUNK_BYTES), str(CHUNK_BYTES)],
        capture_output=True, text=True, timeout=120, env=QUIET)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def kvtier_replay(trace: Path, chunks: int) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "kvtier", "simulate", "--trace", str(trace), "--format", "lmcache",
         "--gpu-tokens", str(chunks * CHUNK_TOKENS), "--policy", "lru", "--json"],
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_kvtiers_lru_replay_of_the_lookup_log_hits_what_lmcaches_simulator_hits(lmcache):
    lmcache.bench(10, 14)
    lmcache.bench(12, 16)  # sequences 12 and 13 again: their cold lookups hit given the room
    time.sleep(1.0)  # the log is written off the lookup path
    hits = {}
    for chunks in (3, 4, 8, 16, 64):
        theirs, ours = lmcache_simulator(lmcache, chunks), kvtier_replay(lmcache.hash_log, chunks)
        assert theirs["cache_capacity_chunks"] == ours["gpu_blocks"] == chunks
        assert ours["cpu_blocks"] == 0 and ours["requests"] == theirs["total_requests"]
        assert ours["prompt_tokens"] == theirs["total_tokens"]
        assert ours["gpu_hit_tokens"] == theirs["total_hit_tokens"], chunks
        hits[chunks] = ours["gpu_hit_tokens"]
    # the capacities matter: a 4-chunk lookup never hits in 3 chunks, more room hits more
    assert hits[3] == 0 < hits[4] <= hits[8] <= hits[16] <= hits[64]
    assert len(set(hits.values())) >= 3
    # with room for every chunk, as the server's 1 GB L1 had, the replay hits what it served
    assert hits[64] == lmcache.counters()["lmcache_mp_lookup_hit_tokens_total"]
