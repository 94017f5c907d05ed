"""A Ray cluster on this machine, as a team would run one across hosts: a head and a second
node, each its own ``ray start --block`` process (so stopping that process stops what it
started, and nothing else on the host), with one CPU each. Every port it binds is its own
(free ports for the fixed ones), its files under a folder of the test's."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import free_port

RAY = Path(sys.executable).with_name("ray")
OBJECT_STORE_BYTES = 100 << 20  # /dev/shm is shared with everything else on the host


class LocalRayCluster:
    def __init__(self, root: Path, nodes: int = 2, cpus_per_node: int = 1):
        self.root, self.nodes, self.cpus = root, nodes, cpus_per_node
        self.address: str | None = None
        self._processes: list[subprocess.Popen] = []

    def start(self, timeout_s: float = 120.0) -> str:
        self.root.mkdir(parents=True, exist_ok=True)
        port = free_port()
        self.address = f"127.0.0.1:{port}"
        self._launch("head", ["--head", "--port", str(port), "--include-dashboard", "false",
                              "--temp-dir", str(self.root / "ray")])
        self._wait_for(1, timeout_s)
        for n in range(1, self.nodes):
            self._launch(f"node-{n}", ["--address", self.address])
        self._wait_for(self.nodes, timeout_s)
        return self.address

    def _launch(self, name: str, flags: list[str]) -> None:
        log = open(self.root / f"ray-{name}.log", "w")
        self._processes.append(subprocess.Popen(
            [str(RAY), "start", *flags, "--num-cpus", str(self.cpus), "--block",
             "--disable-usage-stats", "--object-store-memory", str(OBJECT_STORE_BYTES),
             "--dashboard-agent-listen-port", str(free_port()),
             "--min-worker-port", "0", "--max-worker-port", "0"],
            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"},
            start_new_session=True))

    def _wait_for(self, nodes: int, timeout_s: float) -> None:
        """Until the cluster has ``nodes`` alive (asked of the cluster itself)."""
        deadline = time.monotonic() + timeout_s
        script = ("import ray; ray.init(address=%r, logging_level='ERROR', log_to_driver=False); "
                  "print(sum(n['Alive'] for n in ray.nodes()))" % self.address)
        while time.monotonic() < deadline:
            for process in self._processes:
                if process.poll() is not None:
                    raise RuntimeError(f"ray start exited {process.returncode}; see {self.root}")
            try:
                done = subprocess.run([sys.executable, "-c", script], capture_output=True,
                                      text=True, timeout=30)
            except subprocess.TimeoutExpired:
                continue  # not up yet: look at the processes again
            if done.returncode == 0 and done.stdout.strip().isdigit() and int(done.stdout) >= nodes:
                return
            time.sleep(1.0)
        raise TimeoutError(f"the Ray cluster at {self.address} has not {nodes} nodes after {timeout_s} s")

    def stop(self) -> None:
        """Each ``ray start --block`` stops what it started on SIGTERM; the node first."""
        for process in reversed(self._processes):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)  # its own session: only what it started
                    process.wait(timeout=10)
        self._processes.clear()

    def __enter__(self) -> "LocalRayCluster":
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
