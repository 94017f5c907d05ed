"""Killing a serving engine mid-run leaves a readable store and no half-written file blocks.
SIGTERM stops it cleanly (everything recorded is flushed); SIGKILL loses only unflushed rows."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import urllib.request

import pytest

from kvtier.refengine.file_tier import SUFFIX, TMP_SUFFIX
from tests.refengine.conftest import prompt

SERVE = ("import sys; from kvtier.verbs import engine as v; import argparse; "
         "p = argparse.ArgumentParser(); v.add_arguments(p); sys.exit(v.run(p.parse_args(sys.argv[1:])))")


def start(tmp_path) -> tuple[subprocess.Popen, int]:
    """The engine on a port the kernel picks (``--port 0``), and the port its first line names."""
    args = ["--port", "0", "--gpu-blocks", "12", "--cpu-blocks", "4", "--file-blocks", "400",
            "--file-dir", str(tmp_path / "files"), "--block-size", "4", "--vocab-size", "97",
            "--store", str(tmp_path / "store.duckdb")]
    process = subprocess.Popen([sys.executable, "-c", SERVE, *args], stdout=subprocess.PIPE, text=True)
    first = process.stdout.readline()  # reference engine on http://127.0.0.1:P (model ...)
    assert first.startswith("reference engine on http://127.0.0.1:"), first
    return process, int(first.split()[3].rsplit(":", 1)[1])


def send(port, i) -> int:
    body = json.dumps({"prompt": prompt(i), "max_tokens": 4}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body)
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status
    except OSError:
        return 0


def stop(process):
    if process.poll() is None:
        process.kill()
    process.wait(timeout=30)


@pytest.mark.timeout(120)
def test_sigterm_flushes_every_finished_request(tmp_path):
    process, port = start(tmp_path)
    try:
        statuses = [send(port, i) for i in range(6)]
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
    finally:
        stop(process)
    from kvtier.collector.store import TraceStore

    with TraceStore(tmp_path / "store.duckdb") as store:
        assert statuses == [200] * 6 and store.count("requests") == 6


@pytest.mark.timeout(120)
def test_sigkill_mid_load_leaves_a_consistent_store_and_whole_blocks(tmp_path):
    process, port = start(tmp_path)
    try:
        workers = [threading.Thread(target=lambda k=k: [send(port, 100 * k + i) for i in range(40)])
                   for k in range(3)]
        for worker in workers:
            worker.start()
        send(port, 999)  # at least one request done, and the load continues
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
        for worker in workers:
            worker.join(timeout=60)
    finally:
        stop(process)
    from kvtier.collector.store import TraceStore

    with TraceStore(tmp_path / "store.duckdb") as store:  # opens: committed batches are whole
        ledger = store.query("SELECT coalesce(sum(block_events), 0) AS e, coalesce(sum(requests), 0) AS r "
                             "FROM ingested_batches").to_pylist()[0]
        assert (store.count("block_events"), store.count("requests")) == (ledger["e"], ledger["r"])
    block_bytes = 2 * 2 * 4 * 2 * 16 * 4  # layers, K/V, tokens, heads, head_dim, float32
    sizes = {p.stat().st_size for p in (tmp_path / "files").glob("*" + SUFFIX)}
    assert sizes <= {block_bytes}
    leftovers = list((tmp_path / "files").glob("*" + TMP_SUFFIX))
    # a killed writer may leave a temporary file; never a block under its final name, and
    # the next engine to open the folder removes the leftovers
    if leftovers:
        import torch

        from kvtier.refengine.file_tier import FileTier

        FileTier(tmp_path / "files", 4, (2, 2, 4, 2, 16), torch.float32, "lru", 1).close()
        assert list((tmp_path / "files").glob("*" + TMP_SUFFIX)) == []

