"""A hostile client cannot wedge the engine's HTTP server: malformed or huge bodies are
answered (400, 411, 413) without reading them, a client that hangs up has its request
aborted (slot and KV blocks freed), and a tier switch the host cannot allocate is refused.

Every case talks to a running server through a real socket."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest

from kvtier.refengine.config import EngineConfig, TierConfig
from kvtier.refengine.server import CLIENT_GONE, MAX_BODY_BYTES, EngineServer, ServerSettings
from tests.refengine.conftest import prompt, tiny_config
from tests.refengine.test_server import complete

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def server(tmp_path):
    srv = EngineServer(tiny_config(tmp_path, gpu_blocks=12), ServerSettings(port=0))
    try:
        yield srv.start()
    finally:
        srv.stop()


def connect(srv) -> socket.socket:
    host, port = srv._http.server_address[:2]
    sock = socket.create_connection((host, port), timeout=60)
    return sock


def exchange(srv, head: str, body: bytes = b"") -> tuple[int, dict]:
    """Send raw bytes; the status and JSON body of the answer (the server closes after it)."""
    with connect(srv) as sock:
        sock.sendall(head.encode() + b"\r\n" + body)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    status_line, _, rest = data.partition(b"\r\n")
    return int(status_line.split()[1]), json.loads(rest.partition(b"\r\n\r\n")[2])


def post_head(path: str, length: str) -> str:
    return f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n"


@pytest.mark.parametrize("length, status, says", [
    ("-1", 400, "Content-Length must be a whole number"),
    ("abc", 400, "Content-Length must be a whole number"),
    ("1e3", 400, "Content-Length must be a whole number"),
    (str(10 ** 11), 413, f"exceeds the limit of {MAX_BODY_BYTES} bytes"),
])
def test_a_bad_content_length_is_answered_without_waiting_for_a_body(server, length, status, says):
    code, body = exchange(server, post_head("/v1/completions", length))  # no body follows
    assert code == status and says in body["error"]["message"]


def test_too_many_or_too_long_headers_are_refused(server):
    many = "".join(f"X-Filler-{i}: {i}\r\n" for i in range(200))
    assert exchange_status(server, post_head("/v1/completions", "0") + many) == 431
    assert exchange_status(server, post_head("/v1/completions", "0") + "X-Long: " + "a" * 70_000 + "\r\n") == 431


def exchange_status(srv, head: str) -> int:
    with connect(srv) as sock:
        sock.sendall(head.encode() + b"\r\n")
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return int(data.split(b" ", 2)[1])


def test_idle_connections_cannot_take_every_thread():
    srv = EngineServer(tiny_config(gpu_blocks=12), ServerSettings(port=0, max_connections=3)).start()
    idle = [connect(srv) for _ in range(3)]
    try:
        for sock in idle:  # each holds a handler thread, waiting for its request line
            sock.sendall(b"GET /health HTTP/1.1\r\n")
        deadline = time.monotonic() + 60  # bounds a broken server, not a timing assertion
        while exchange_status(srv, "GET /health HTTP/1.1\r\nHost: x\r\n") != 503:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        for sock in idle:
            sock.close()
    try:
        while exchange_status(srv, "GET /health HTTP/1.1\r\nHost: x\r\n") != 200:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        srv.stop()


def test_a_chunked_body_is_refused(server):
    head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
    code, body = exchange(server, head, b"5\r\nhello\r\n0\r\n\r\n")
    assert code == 411 and "Content-Length" in body["error"]["message"]


@pytest.mark.parametrize("depth", [65, 100_000])
def test_deeply_nested_json_is_a_400(server, depth):
    data = b"[" * depth + b"]" * depth
    code, body = exchange(server, post_head("/v1/completions", str(len(data))), data)
    assert code == 400 and "nests deeper than 64 levels" in body["error"]["message"]


def test_brackets_inside_strings_do_not_count_as_nesting(server):
    data = json.dumps({"prompt": [1, 2], "max_tokens": 1, "user": "[" * 1000}).encode()
    code, body = exchange(server, post_head("/v1/completions", str(len(data))), data)
    assert code == 200 and body["usage"]["completion_tokens"] == 1


def test_a_body_that_is_not_json_is_a_400_and_the_server_keeps_serving(server):
    data = b"\xff\xfe{not json"
    code, body = exchange(server, post_head("/v1/completions", str(len(data))), data)
    assert code == 400 and "not JSON" in body["error"]["message"]
    assert complete(server, prompt(1))["usage"]["completion_tokens"] == 4


def tiers_now(srv) -> dict:
    with connect(srv) as sock:
        sock.sendall(b"GET /admin/tiers HTTP/1.1\r\nHost: x\r\n\r\n")
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return json.loads(data.partition(b"\r\n\r\n")[2])


@pytest.mark.parametrize("body, says", [
    ([1], "must be a JSON object of tier fields, got list"),
    ({"cpu_blocks": 1e11}, "cpu_blocks must be an int >= 0, got 100000000000.0"),
    ({"cpu_blocks": 10 ** 11}, "cpu_blocks=100000000000 needs"),
    ({"gpu_blocks": 10 ** 12}, "gpu_blocks=1000000000000 needs"),
    ({"gpu_blocks": 12, "cpu_blocks": 4, "cold_blocks": 10 ** 15}, "cold_blocks=1000000000000000 needs"),
    ({"gpu_blocks": True}, "gpu_blocks must be an int >= 1"),
    ({"gpu_blocks": 12, "cpu_blocks": "8"}, "cpu_blocks must be an int >= 0"),
])
def test_a_tier_switch_the_host_cannot_hold_is_refused_naming_the_field(server, body, says):
    before = tiers_now(server)
    data = json.dumps(body).encode()
    code, reply = exchange(server, post_head("/admin/tiers", str(len(data))), data)
    assert code == 400 and says in reply["error"]["message"], reply
    if "needs" in says:
        assert "bytes a block" in reply["error"]["message"] and "available" in reply["error"]["message"]
    assert tiers_now(server) == before and before["switch_pending"] is False
    assert complete(server, prompt(2))["kvtier"]["tier_config_id"] == before["config_id"]


def test_a_switch_that_fails_to_allocate_keeps_the_tiers_that_worked(server, monkeypatch):
    import kvtier.refengine.engine as engine_module

    real = engine_module.KvCacheManager

    def allocate(config, *args, **kwargs):
        if config.tiers.config_id == "next":
            raise RuntimeError("not enough memory: you tried to allocate 819 TB")
        return real(config, *args, **kwargs)

    monkeypatch.setattr(engine_module, "KvCacheManager", allocate)
    before = tiers_now(server)
    data = json.dumps({"gpu_blocks": 12, "cpu_blocks": 4, "config_id": "next"}).encode()
    assert exchange(server, post_head("/admin/tiers", str(len(data))), data)[0] == 202
    assert complete(server, prompt(6))["kvtier"]["tier_config_id"] == before["config_id"]
    after = tiers_now(server)
    assert after["config_id"] == before["config_id"] and after["switch_pending"] is False
    assert after["switch_error"].startswith("tiers next could not be allocated: not enough memory")


@pytest.fixture
def long_server():
    """Requests that could generate ~2,000 tokens each; four run at once."""
    config = EngineConfig(layers=2, heads=2, head_dim=8, vocab_size=97, max_positions=2048,
                          block_size_tokens=16, max_batch_size=4, seed=7, tiers=TierConfig(gpu_blocks=600))
    srv = EngineServer(config, ServerSettings(port=0))
    submitted = []
    submit = srv.submit

    def remember(prompt_ids, max_tokens):
        seq, tokens = submit(prompt_ids, max_tokens)
        submitted.append(seq)
        return seq, tokens

    srv.submit = remember
    try:
        yield srv.start(), submitted
    finally:
        srv.stop()


def all_ended(srv, seqs, count: int) -> bool:
    """Wait (bounded, for a hung server) until ``count`` requests ended and the batch is empty."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        ended = len(seqs) >= count and all(s.finished or s.error is not None for s in seqs)
        if ended and not srv.engine.scheduler.running and not srv.engine.queued_requests:
            return True
        time.sleep(0.05)
    return False


def test_streaming_clients_that_hang_up_are_aborted_and_free_their_blocks(long_server):
    srv, seqs = long_server
    body = json.dumps({"prompt": prompt(3), "max_tokens": 2000, "stream": True}).encode()

    def hang_up_after_first_chunk(i: int) -> None:
        with connect(srv) as sock:
            sock.sendall(post_head("/v1/completions", str(len(body))).encode() + b"\r\n" + body)
            data = b""
            while b"data: " not in data:
                data += sock.recv(4096)

    clients = [threading.Thread(target=hang_up_after_first_chunk, args=(i,)) for i in range(10)]
    for client in clients:
        client.start()
    for client in clients:
        client.join(120)
    assert all_ended(srv, seqs, 10)
    assert all(s.error == CLIENT_GONE and len(s.output) < 2000 for s in seqs)
    stored = srv.recorder.take_events().requests.to_pylist()
    assert len(stored) == 10 and {r["finish_status"] for r in stored} == {"aborted"}
    gpu = srv.engine.kv.gpu
    assert gpu.available() == gpu.num_blocks  # no slot held by a request
    assert complete(srv, prompt(4), max_tokens=4)["usage"]["completion_tokens"] == 4


def test_a_plain_request_whose_client_hangs_up_is_aborted(long_server):
    srv, seqs = long_server
    body = json.dumps({"prompt": prompt(5), "max_tokens": 2000}).encode()
    with connect(srv) as sock:
        sock.sendall(post_head("/v1/completions", str(len(body))).encode() + b"\r\n" + body)
        while not seqs:
            time.sleep(0.01)
    assert all_ended(srv, seqs, 1)
    assert seqs[0].error == CLIENT_GONE and len(seqs[0].output) < 2000
    gpu = srv.engine.kv.gpu
    assert gpu.available() == gpu.num_blocks
