"""The dashboard in a real headless browser: ``kvtier dashboard`` on loopback, Debian's
chromium driven by Playwright. Each page must draw its charts with data; a screenshot of
each page is saved under ``test-artifacts/dashboard/`` (git-ignored) for people to look at.

Skipped when Playwright or ``/usr/bin/chromium`` is missing (CI installs both).
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

import pytest

from tests.conftest import REPO, free_port
from tests.dashboard.curve_files import write_live_curves
from tests.dashboard.fixtures import write_recommendation

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = REPO / "test-artifacts" / "dashboard"
CHARTS = "[data-testid='stVegaLiteChart'] canvas, [data-testid='stVegaLiteChart'] svg.marks"
# page slug -> charts it draws with the fixture data (0: checked by its other content)
EXPECTED_CHARTS = {"overview": 3, "latency": 5, "reuse": 4, "whatif": 1, "recommendation": 4,
                   "live": 1}

if os.environ.get("CI") == "true":  # make test installs both: a skip there would hide a broken set-up
    import playwright.sync_api as playwright_api
    if not CHROMIUM.exists():
        raise RuntimeError("CI: /usr/bin/chromium is missing (scripts/system-deps.sh installs it)")
else:
    playwright_api = pytest.importorskip("playwright.sync_api", reason="Playwright is not installed "
                                         "(pip install playwright; no 'playwright install' needed)")
pytestmark = [
    pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian chromium missing (apt-get install -y chromium)"),
    pytest.mark.timeout(240),
]


def wait_healthy(url: str, child: subprocess.Popen, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if child.poll() is not None:
            raise RuntimeError(f"kvtier dashboard exited with {child.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError(f"{url} not healthy after {timeout_s} s")


def planning_files(root: Path) -> tuple[Path, Path]:
    whatif, reco = root / "whatif", root / "recommendation"
    whatif.mkdir()
    points = [{"policy": p, "cpu_capacity_tokens": c, "token_hit_ratio": r * s}
              for p, s in (("lru", 0.8), ("arc", 0.9), ("belady", 1.0))
              for c, r in ((1e5, 0.2), (5e5, 0.45), (1e6, 0.6), (4e6, 0.7))]
    (whatif / "sweep.json").write_text(json.dumps({"points": points,
                                                   "chosen": {"policy": "arc", "cpu_capacity_tokens": 1e6}}))
    write_recommendation(reco, ttft_p99_budget_s=0.5)
    return whatif, reco


@pytest.fixture(scope="module")
def dashboard_url(full_segments):
    whatif, reco = planning_files(full_segments.parent)
    live = write_live_curves(full_segments.parent / "collector-segments")
    port = free_port()  # Streamlit binds the port it is given and names no port it picked
    command = [sys.executable, "-m", "kvtier", "dashboard", "--segments", str(full_segments),
               "--host", "127.0.0.1", "--port", str(port), "--whatif", str(whatif),
               "--recommendation", str(reco), "--live-curves", str(live)]
    # Own process group: the verb starts Streamlit as its child, and both must go.
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, child)
        yield url
    finally:
        os.killpg(child.pid, signal.SIGTERM)
        try:
            child.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait(timeout=15)


@pytest.fixture(scope="module")
def browser():
    with playwright_api.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic"])
        try:
            yield chromium
        finally:
            chromium.close()


# Share of a canvas's pixels that are not background: a drawn chart has axes, labels and marks.
_INK_SHARE_JS = """canvas => {
  const ctx = canvas.getContext('2d'); const {width, height} = canvas;
  const px = ctx.getImageData(0, 0, width, height).data; let ink = 0;
  for (let i = 0; i < px.length; i += 4) { if (px[i+3] > 0 && (px[i] < 230 || px[i+1] < 230 || px[i+2] < 230)) ink++; }
  return ink / (width * height); }"""


def open_page(page, url: str, slug: str) -> None:
    page.goto(f"{url}/?page={slug}", wait_until="domcontentloaded")
    page.wait_for_selector("h1:has-text('kvtier')", timeout=60_000)
    if slug == "recommendation":  # its last element: the configs come after the chart
        page.wait_for_selector("text=host_cache_size", timeout=60_000)
    if EXPECTED_CHARTS[slug]:
        page.wait_for_function("([sel, n]) => document.querySelectorAll(sel).length >= n",
                               arg=[CHARTS, EXPECTED_CHARTS[slug]], timeout=60_000)
    # The script run is over when the "Running..." status widget is gone.
    page.wait_for_selector("[data-testid='stStatusWidget']", state="detached", timeout=60_000)
    page.wait_for_timeout(500)  # let Vega finish painting the last frame before the screenshot


@pytest.mark.parametrize("slug", list(EXPECTED_CHARTS))
def test_page_draws_its_charts_and_is_screenshotted(dashboard_url, browser, slug):
    page = browser.new_page(viewport={"width": 1400, "height": 2800})
    try:
        open_page(page, dashboard_url, slug)
        assert not page.query_selector("[data-testid='stException']")
        drawn = page.query_selector_all(CHARTS)
        assert len(drawn) == EXPECTED_CHARTS[slug]
        for element in drawn:
            if element.evaluate("e => e.tagName") == "CANVAS":
                assert element.evaluate(_INK_SHARE_JS) > 0.01
            else:
                assert len(element.query_selector_all("path, rect")) > 3
        if slug == "recommendation":
            main = page.inner_text("[data-testid='stMain']")
            assert "Verdict: offload" in main and "within budget" in main
            codes = [c.inner_text() for c in page.query_selector_all("[data-testid='stCode']")]
            assert any("OffloadingConnector" in c for c in codes)
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        # Streamlit scrolls inside its own container: the tall viewport is what shows it all.
        page.screenshot(path=str(ARTIFACTS / f"{slug}.png"), full_page=True)
    finally:
        page.close()
