"""A serving vLLM with a slow CPU tier on purpose, kvtier's collector watching it with its
guardrail, and traffic at concurrency 4: what the guardrail tests and benchmark drive.

The engine runs kvtier's connector with a control token and a short lease, and the test copy
worker with an injected delay per load job (``cpu_copy_worker.py``, the file
:attr:`GuardedEngine.delay_file`). Traffic (:class:`Traffic`) is 4 client threads over
sessions on a shared system prompt whose prefixes outgrow the GPU's KV cache, so requests
keep coming back to the CPU tier; it runs in phases with no request in flight between them,
so each phase's vLLM counters and store records cover the same requests.
"""

from __future__ import annotations

import json
import random
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from tests.conftest import free_port
from tests.probes.vllm.cpu_copy_worker import DELAY_VARIABLE
from tests.probes.vllm.serving import (CollectorProcess, EngineSetup, VllmServer, build_model,
                                       scrape, total)

TOKEN = "guardrail-test-token-0123456789abcdef"
INSTANCE = "tiny-vllm"
CONCURRENCY = 4
SESSIONS, PREFIX_TOKENS, TURN_TOKENS, MAX_HISTORY_TOKENS = 8, 320, 96, 768
# vLLM's counters each phase's store records are checked against
COUNTERS = ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
            "vllm:external_prefix_cache_hits_total", "vllm:request_success_total")
LOCAL = ("vllm:prompt_tokens_by_source_total", {"source": "local_compute"})


def prompts(seed: int = 0):
    """An endless stream of prompts: sessions in turn on one shared prefix, each turn adding
    to its session's history (restarted before the model's limit)."""
    rng = random.Random(seed)
    prefix = [rng.randrange(3, 2000) for _ in range(PREFIX_TOKENS)]
    history = {s: [] for s in range(SESSIONS)}
    lock, turn = threading.Lock(), 0
    while True:
        with lock:
            s = turn % SESSIONS
            turn += 1
            if len(history[s]) >= MAX_HISTORY_TOKENS:
                history[s] = []
            history[s] = history[s] + [rng.randrange(3, 2000) for _ in range(TURN_TOKENS)]
            prompt = prefix + history[s]
        yield prompt


@dataclass
class Phase:
    """One traffic phase: its wall-clock span, what the clients saw, vLLM's counter deltas."""

    name: str
    start_s: float = 0.0
    end_s: float = 0.0
    sent: int = 0
    failed: list = field(default_factory=list)
    counters: dict = field(default_factory=dict)


class Traffic:
    """``CONCURRENCY`` clients sending the prompt stream to ``url`` (see module doc)."""

    def __init__(self, url: str, model: str, max_tokens: int = 4):
        self.url, self.model, self.max_tokens = url, model, max_tokens
        self._prompts = prompts()
        self._lock = threading.Lock()

    def run(self, phase: Phase, until, max_s: float = 120.0) -> Phase:
        """Send until ``until()`` is true (checked every 0.2 s; at most ``max_s``), then let
        every request in flight finish."""
        stop = threading.Event()
        phase.start_s = time.time()

        def client() -> None:
            while not stop.is_set():
                with self._lock:
                    prompt = next(self._prompts)
                    phase.sent += 1
                error = self._send(prompt)
                if error is not None:
                    phase.failed.append(error)

        threads = [threading.Thread(target=client, daemon=True) for _ in range(CONCURRENCY)]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + max_s
        while not until() and time.monotonic() < deadline:
            time.sleep(0.2)
        stop.set()
        for thread in threads:
            thread.join(120)
        phase.end_s = time.time()
        return phase

    def _send(self, prompt: list[int]) -> str | None:
        body = json.dumps({"model": self.model, "prompt": prompt, "max_tokens": self.max_tokens,
                           "temperature": 0, "ignore_eos": True}).encode()
        request = urllib.request.Request(self.url + "/v1/completions", body,
                                         {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=120) as reply:
                reply.read()
                return None if reply.status == 200 else f"HTTP {reply.status}"
        except (urllib.error.URLError, OSError) as error:
            return str(error)


def for_seconds(seconds: float):
    deadline = time.monotonic() + seconds
    return lambda: time.monotonic() >= deadline


class GuardedEngine:
    """One vLLM engine with kvtier's connector listening to ``control`` (a short lease), the
    slow-tier shim, and its counters read between phases."""

    def __init__(self, python: str, workdir: Path, hooks: str, control: str, *,
                 lease_s: float = 5.0, token: str | None = TOKEN, instance: str = INSTANCE,
                 extra_path: tuple[str, ...] = (), env: dict | None = None):
        """``token`` ``None``: no control channel (the connector never listens);
        ``extra_path``/``env``: more for the engine's process (a benchmark's step timer)."""
        self.workdir = workdir
        self.model = build_model(python, workdir / "model")
        self.delay_file = workdir / f"load-delay-s-{instance}"
        self.set_delay(0.0)
        extra = {"kvtier_control": control, "kvtier_control_lease_s": lease_s}
        if token is not None:
            extra["kvtier_control_token"] = token
        self.setup = EngineSetup(port=free_port(), hooks=hooks, instance=instance,
                                 ship_interval_s=0.2, extra=extra)
        self.server = VllmServer(python, self.model, self.setup, workdir, extra_path=extra_path,
                                 env={DELAY_VARIABLE: str(self.delay_file), **(env or {})})

    def set_delay(self, seconds: float) -> None:
        self.delay_file.write_text(f"{seconds}\n")

    def counters(self) -> dict:
        samples = scrape(self.server.url + "/metrics")
        out = {name: total(samples, name) for name in COUNTERS}
        out["local_compute"] = total(samples, LOCAL[0], **LOCAL[1])
        return out

    def phase(self, traffic: Traffic, name: str, until, max_s: float = 120.0) -> Phase:
        before = self.counters()
        phase = traffic.run(Phase(name), until, max_s)
        time.sleep(0.3)  # the last steps' counters reach /metrics
        after = self.counters()
        phase.counters = {k: after[k] - before[k] for k in after}
        return phase


def guardrail_collector(store: Path, hooks: str, control: str, mode: str, budget_s: float,
                        token_file: Path | None, **rule) -> CollectorProcess:
    """``kvtier collect`` with its guardrail in ``mode`` on a fast rule (seconds, not minutes:
    the test's windows), the control channel at ``control``."""
    settings = {"window_s": 3, "sustained_s": 2, "step_s": 0.5, "hold_s": 6.0, "costs": None,
                **rule}
    extra = ["--guardrail", mode, "--guardrail-control", control,
             "--ttft-p99-budget-s", f"{budget_s:.4f}", "--itl-p99-budget-s", "30",
             "--window-s", str(settings["window_s"]), "--sustained-s", str(settings["sustained_s"]),
             "--guardrail-step-s", str(settings["step_s"]),
             "--guardrail-hold-s", str(settings["hold_s"])]
    if token_file is not None:
        extra += ["--guardrail-token-file", str(token_file)]
    if settings.get("costs") is not None:
        extra += ["--guardrail-costs", str(settings["costs"])]
    return CollectorProcess(store, hooks=hooks, instance="collector", extra=tuple(extra))


def guardrail_state(collector: CollectorProcess, instance: str = INSTANCE) -> dict:
    """The collector's ``/guardrail`` page for ``instance`` (``{}`` before it has heard from
    it)."""
    url = collector.metrics_url.rsplit("/", 1)[0] + "/guardrail"
    with urllib.request.urlopen(url, timeout=10) as reply:
        status = json.loads(reply.read())
    return next((i for i in status["instances"] if i["instance"] == instance), {})


def endpoints() -> tuple[str, str]:
    return f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
