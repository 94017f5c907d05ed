"""After ``kvtier demo``, the dashboard in a real headless browser shows what the demo wrote:
the What-if page draws one line per policy (Belady's bound among them) and the
Recommendation page leads with the settings. The demo and the ``kvtier dashboard`` command it
prints run from kvtier's installed wheel, outside the checkout (tests/installed.py), with the
dashboard's defaults (what-if and recommendation folders beside the segments); Debian's
chromium is driven by Playwright, and screenshots are saved under
``test-artifacts/dashboard/demo-*.png`` for people to look at."""

from __future__ import annotations

import json
import signal
import subprocess

import pytest

from tests.conftest import free_port
from tests.dashboard.test_browser import ARTIFACTS, CHARTS, CHROMIUM, browser, wait_healthy  # noqa: F401

pytestmark = [pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian chromium missing"),
              pytest.mark.timeout(600)]

# Vega draws the chart as SVG: each line mark is a <path> in a "mark-line" group, stroked in
# its series' colour; the dash pattern of the bound is on the path too.
_LINES_JS = """svg => Array.from(svg.querySelectorAll('g.mark-line path')).map(p => ({
  stroke: (p.getAttribute('stroke') || '').toLowerCase(), dash: p.getAttribute('stroke-dasharray') || '',
  length: p.getTotalLength()}))"""


def dashboard_command(demo_stdout: str) -> list[str]:
    """The dashboard command line the demo prints as its way in (``open the dashboard: ...``)."""
    lines = [line.split(":", 1)[1].split() for line in demo_stdout.splitlines()
             if line.strip().startswith("open the dashboard:")]
    assert len(lines) == 1 and lines[0][:2] == ["kvtier", "dashboard"], demo_stdout[-2000:]
    return lines[0][1:]


@pytest.fixture(scope="module")
def demo_dashboard(installed, installed_demo):
    """The demo and then the dashboard command it prints, both as a user runs them: kvtier's
    wheel installed in a clean venv, started from a folder outside the checkout."""
    port = free_port()  # Streamlit binds the port it is given and names no port it picked
    child = installed.popen(*dashboard_command(installed_demo.stdout), "--port", str(port),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, child)
        yield url, installed_demo.out
    finally:
        child.send_signal(signal.SIGTERM)  # the verb stops its Streamlit group itself
        child.wait(timeout=30)


def _open(browser, url: str, slug: str, charts: int):
    page = browser.new_page(viewport={"width": 1400, "height": 2600})
    page.goto(f"{url}/?page={slug}", wait_until="domcontentloaded")
    page.wait_for_selector("h1:has-text('kvtier')", timeout=60_000)
    page.wait_for_function("([sel, n]) => document.querySelectorAll(sel).length >= n",
                           arg=[CHARTS, charts], timeout=90_000)
    page.wait_for_selector("[data-testid='stStatusWidget']", state="detached", timeout=60_000)
    page.wait_for_timeout(800)
    return page


def test_whatif_after_the_demo_draws_one_line_per_policy(demo_dashboard, browser):
    from kvtier.dashboard.charts import POLICY_COLOURS

    url, out = demo_dashboard
    sweep = json.loads((out / "whatif" / "cpu_sweep.json").read_text())
    policies = sorted({p["policy"] for p in sweep["points"]})
    assert "belady" in policies and len(policies) >= 3
    page = _open(browser, url, "whatif", 1)
    try:
        assert not page.query_selector("[data-testid='stException']")
        (element,) = page.query_selector_all(CHARTS)
        lines = element.evaluate(_LINES_JS)
        by_colour = {}
        for line in lines:
            by_colour.setdefault(line["stroke"], []).append(line)
        for policy, colour in zip(policies, POLICY_COLOURS):
            drawn = by_colour.get(colour.lower(), [])
            assert len(drawn) == 1 and drawn[0]["length"] > 100, f"{policy}: {drawn}"
            dashed = drawn[0]["dash"].replace(" ", "") not in ("", "1,0")
            assert dashed == (policy == "belady")  # the bound is dashed
        assert len(lines) == len(policies)
        assert "CPU capacity" in page.inner_text("[data-testid='stMain']")
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "demo-whatif.png"), full_page=True)
    finally:
        page.close()


def test_recommendation_after_the_demo_leads_with_what_to_set(demo_dashboard, browser):
    url, out = demo_dashboard
    doc = json.loads((out / "recommendation" / "recommendation.json").read_text())
    page = _open(browser, url, "recommendation", 3)
    try:
        main = page.inner_text("[data-testid='stMain']")
        assert f"Verdict: {doc['evidence']['verdict'].replace('_', ' ')}" in main
        assert main.index("What to set") < main.index("Time to first token against the GPU tier alone")
        assert f"{doc['settings']['cpu_tier_bytes']:,}" in main
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "demo-recommendation.png"), full_page=True)
        for slug, charts in (("overview", 2), ("latency", 4), ("reuse", 3)):
            other = _open(browser, url, slug, charts)
            try:
                assert not other.query_selector("[data-testid='stException']")
                other.screenshot(path=str(ARTIFACTS / f"demo-{slug}.png"), full_page=True)
            finally:
                other.close()
    finally:
        page.close()
