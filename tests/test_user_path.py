"""Every verb as a user runs it: kvtier's wheel installed non-editable into a clean venv, the
working folder outside the checkout, nothing of the checkout on the import path
(tests/installed.py). Under pytest the checkout is on ``sys.path``, which hides any module
looked up by a name only the checkout has (a top-level ``dashboard``); these runs do not."""

from __future__ import annotations

import signal
import subprocess
import time
import urllib.request

import pytest

from kvtier.cli import VERBS
from tests.conftest import free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def test_kvtier_loads_from_the_install_alone(installed):
    installed.check_origin()


@pytest.mark.parametrize("verb", list(VERBS))
def test_every_verb_answers_help_outside_the_checkout(installed, verb):
    done = installed.run(verb, "--help", timeout_s=60)
    assert "example:" in done.stdout and f"kvtier {verb}" in done.stdout


def _get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.status, response.read().decode(errors="replace")


def test_the_dashboard_serves_from_the_install(installed):
    segments = installed.away / "empty-segments"
    segments.mkdir(exist_ok=True)
    port = free_port()
    child = installed.popen("dashboard", "--segments", str(segments), "--port", str(port),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline, status = time.monotonic() + 60, None
        while time.monotonic() < deadline and child.poll() is None:
            try:
                status, body = _get(f"http://127.0.0.1:{port}/_stcore/health")
                break
            except OSError:
                time.sleep(0.3)
        assert child.poll() is None, f"kvtier dashboard exited {child.returncode}: {child.stdout.read()}"
        assert (status, body) == (200, "ok")
        status, page = _get(f"http://127.0.0.1:{port}/")
        assert status == 200 and "<html" in page.lower()
    finally:
        child.send_signal(signal.SIGTERM)
        child.wait(timeout=30)
    assert child.returncode == 0, "SIGTERM is the dashboard's normal end"
