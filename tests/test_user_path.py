"""Every verb as a user runs it: kvtier's wheel installed non-editable into a clean venv, the
working folder outside the checkout, nothing of the checkout on the import path
(tests/installed.py). Under pytest the checkout is on ``sys.path``, which hides any module
looked up by a name only the checkout has (a top-level ``dashboard``); these runs do not.

Each verb's help, then its main path once, on small inputs: the demo (the session's one run,
which the dashboard's browser test reads too) and the verbs that read what it stored, a push
into a small serve config, the probes at tiny sizes, the collector started and stopped by
SIGTERM, the reference engine answering one request, a short rollout against it, the
dashboard serving a page. Every JSON a verb writes or prints is read with a strict parser."""

from __future__ import annotations

import json
import signal
import subprocess
import time
import urllib.request

import pytest

from kvtier.cli import VERBS
from tests.collector.test_json_text import strict
from tests.conftest import ANY_PORT, bound_to, free_port

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
    port = free_port()  # Streamlit binds the port it is given and names no port it picked
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


def _json(installed, *args: str, timeout_s: float = 300.0):
    """``kvtier ARGS`` from the install; its stdout read as strict JSON."""
    return strict(installed.run(*args, timeout_s=timeout_s).stdout)


def _store_counts(store) -> dict[str, int]:
    import duckdb

    with duckdb.connect(str(store), read_only=True) as con:
        return {t: con.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
                for t in ("requests", "block_events", "step_records")}


def test_demo_writes_a_store_segments_and_a_recommendation_in_strict_json(installed_demo):
    out = installed_demo.out
    assert any(line.strip().startswith("open the dashboard: kvtier dashboard --segments")
               for line in installed_demo.stdout.splitlines())
    assert _store_counts(out / "kvtier.duckdb")["requests"] > 0
    assert list((out / "segments" / "requests").rglob("*.parquet"))
    written = sorted(out.rglob("*.json"))
    assert {"recommendation.json", "cpu_sweep.json", "engine-model.json"} <= {p.name for p in written}
    for path in written:  # NaN or Infinity anywhere would raise here
        strict(path.read_text())


def test_store_info_counts_the_demos_store(installed, installed_demo):
    store = installed_demo.out / "kvtier.duckdb"
    info = _json(installed, "store", "info", str(store), "--json")
    counts = _store_counts(store)
    assert (info["requests"], info["block_events"], info["step_records"]) == (
        counts["requests"], counts["block_events"], counts["step_records"])


def test_analyze_reports_reuse_and_a_verdict(installed, installed_demo):
    report = _json(installed, "analyze", "--trace", str(installed_demo.out / "kvtier.duckdb"),
                   "--gpu-tokens", "4k", "--json")
    assert report["trace"]["requests"] > 0 and report["trace"]["block_tokens"] > 0
    assert 0 < report["shared_prefixes"]["ideal_token_hit_ratio"] <= 1
    assert report["offloading"]["verdict"] in ("offload", "do_not_offload", "inconclusive")
    assert report["offloading"]["reasons"]  # each check named


def test_simulate_replays_the_store_through_two_tiers(installed, installed_demo):
    result = _json(installed, "simulate", "--trace", str(installed_demo.out / "kvtier.duckdb"),
                   "--gpu-tokens", "4k", "--cpu-tokens", "16k", "--policy", "lru", "--json")
    served = (result["gpu_hit_tokens"] + result["cpu_promotion_tokens"]
              + result["cold_promotion_tokens"] + result["recompute_tokens"])
    assert result["requests"] > 0 and served == result["prompt_tokens"]
    assert result["cpu_promotion_tokens"] > 0  # the CPU tier served some of it


def test_calibrate_fits_the_engine_that_wrote_the_store(installed, installed_demo, tmp_path):
    import duckdb

    out = tmp_path / "cost-params.json"
    report = _json(installed, "calibrate", str(installed_demo.out / "kvtier.duckdb"), "--out", str(out),
                   "--json")
    store = installed_demo.out / "kvtier.duckdb"
    with duckdb.connect(str(store), read_only=True) as con:  # the engine's own records, not the
        engine = con.execute("SELECT count(*) FROM requests_with_origin "  # load client's view
                             "WHERE engine = 'reference'").fetchone()[0]
    assert report["requests"] == engine and 0 < engine < _store_counts(store)["requests"]
    assert report["step_records"] > 0
    assert strict(out.read_text())["probe"] == "calibrate"


def test_evaluate_compares_cpu_tier_policies(installed, installed_demo):
    result = _json(installed, "evaluate", "--trace", str(installed_demo.out / "kvtier.duckdb"),
                   "--gpu-tokens", "4k", "--cpu-tokens", "16k", "--policies", "lru,belady", "--json")
    ratios = {p["policy"]: p["token_hit_ratio"] for p in result["policies"]}
    assert {"lru", "belady"} <= set(ratios) and ratios["belady"] >= ratios["lru"]  # the bound


def test_recommend_writes_settings_and_engine_configs(installed, installed_demo, tmp_path):
    reco = tmp_path / "reco"
    done = installed.run("recommend", "--store", str(installed_demo.out / "kvtier.duckdb"),
                         "--engine", "vllm", "--out", str(reco))
    assert "verdict:" in done.stdout
    doc = strict((reco / "recommendation.json").read_text())
    assert doc["kind"] == "kvtier.recommendation" and "vllm" in doc["evidence"]["engines"]
    assert strict((reco / "vllm.json").read_text())["kv_connector_extra_config"]["cpu_bytes_to_use"] > 0


SERVE_YAML = """\
# the fleet's serve config
model: m
kv-transfer-config: '{"kv_connector": "KvtierOffloadingConnector", "kv_connector_module_path": "kvtier.probes.vllm.connector", "kv_role": "kv_both", "kv_connector_extra_config": {"spec_name": "KvtierCPUOffloadingSpec", "spec_module_path": "kvtier.probes.vllm.spec", "cpu_bytes_to_use": 1073741824, "kvtier_instance": "node-7"}}'
"""


def test_push_edits_a_serve_config_in_place_with_a_backup(installed, tmp_path):
    reco = tmp_path / "recommendation.json"
    reco.write_text(json.dumps({"settings": {"cpu_tier_bytes": 8 << 20, "eviction_policy": "arc"}}))
    config = tmp_path / "serve.yaml"
    config.write_text(SERVE_YAML)
    done = installed.run("push", "--recommendation", str(reco), "--engine", "vllm", "--config",
                         str(config), "--host-headroom-bytes", str(1 << 30))
    assert f"wrote {config}" in done.stdout and "backup:" in done.stdout
    pushed = config.read_text()
    assert pushed.startswith("# the fleet's serve config\nmodel: m\n")  # the rest is kept
    transfer = json.loads(pushed.split("kv-transfer-config: ", 1)[1].strip().strip("'"))
    extra = transfer["kv_connector_extra_config"]
    assert (extra["cpu_bytes_to_use"], extra["eviction_policy"], extra["kvtier_instance"]) == (
        8 << 20, "arc", "node-7")
    assert transfer["kv_connector"] == "KvtierOffloadingConnector"  # the recording connector stays
    (backup,) = tmp_path.glob("serve.yaml.kvtier-*.bak")
    assert backup.read_text() == SERVE_YAML


def test_probes_measure_transfers_files_and_host_headroom_at_tiny_sizes(installed, tmp_path):
    transfer = _json(installed, "probe", "transfer", "--sizes", "64KiB", "--repeats", "3", "--json")
    assert [r["size_bytes"] for r in transfer["rows"]] == [65536]
    assert all(r["bandwidth_bytes_per_s"] > 0 for r in transfer["rows"])
    (tmp_path / "fs").mkdir()
    fs = _json(installed, "probe", "fs", "--dir", str(tmp_path / "fs"), "--sizes", "64KiB",
               "--threads", "1", "--blocks", "8", "--json")
    assert {r["op"] for r in fs["rows"]} >= {"write", "read"}
    headroom = _json(installed, "probe", "headroom", "--json")
    assert 0 < headroom["safe_bytes"] <= headroom["mem_total_bytes"]


def test_collect_stores_what_an_engine_ships_and_stops_on_sigterm(installed, tmp_path):
    from kvtier.collector.events import Origin, Outcome, RequestRecord
    from kvtier.collector.recorder import Recorder
    from kvtier.collector.shipper import Shipper, ShipperConfig

    store = tmp_path / "kvtier.duckdb"
    errors = tmp_path / "collect.err"
    child = installed.popen("collect", "--store", str(store), "--metrics-port", "0", "--hooks",
                            ANY_PORT, "--segments", str(tmp_path / "segments"),
                            stdout=subprocess.PIPE, stderr=errors.open("w"), text=True)
    try:
        lines = []
        for line in child.stdout:
            lines.append(line)
            if "tap HooksTap started" in line:
                break
        endpoint = bound_to(lines[-1]) if lines else None
        assert endpoint and endpoint.startswith("tcp://127.0.0.1:"), (lines, errors.read_text())
        recorder = Recorder(Origin("vllm", "node-7", "vllm-hooks:node-7:1"))
        for i in range(3):  # an engine's plug-ins: one block and one request record each
            recorder.record(int(Outcome.GPU_HIT), 100 + i, request_id=f"r{i}", time_s=1_800_000_000.0 + i)
            recorder.record_request(RequestRecord(f"r{i}", 1_800_000_000.0 + i, 16, gpu_hit_tokens=16))
        shipper = Shipper(ShipperConfig(endpoint, interval_s=0.05))
        shipper.add(recorder)
        shipper.close()  # ships what it holds, waiting for the collector
        time.sleep(1.0)
    finally:
        child.send_signal(signal.SIGTERM)
        out, _ = child.communicate(timeout=60)
    assert child.returncode == 0, errors.read_text()
    last = [line for line in (lines + out.splitlines()) if line.strip()][-1]
    assert last.startswith("kvtier collect: stopped; the store holds 1 batches, 3 block events "
                           "and 3 requests"), last
    assert list((tmp_path / "segments" / "requests").rglob("*.parquet"))


def _engine(installed, *args: str) -> tuple[subprocess.Popen, str]:
    """``kvtier engine --port 0 ARGS`` from the install, and the URL its first line names."""
    child = installed.popen("engine", "--port", "0", *args, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    first = child.stdout.readline()  # reference engine on http://127.0.0.1:P (model ...)
    assert first.startswith("reference engine on http://127.0.0.1:"), first + child.stderr.read()
    return child, first.split()[3]


def test_engine_serves_a_completion_and_stores_it(installed, tmp_path):
    child, url = _engine(installed, "--gpu-blocks", "16", "--store", str(tmp_path / "engine.duckdb"))
    try:
        body = json.dumps({"prompt": list(range(1, 40)), "max_tokens": 3}).encode()
        request = urllib.request.Request(f"{url}/v1/completions", body,
                                         {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as response:
            answer = strict(response.read().decode())
    finally:
        child.send_signal(signal.SIGTERM)
        child.wait(timeout=60)
    assert child.returncode == 0
    assert answer["object"] == "text_completion" and answer["usage"]["prompt_tokens"] == 39
    assert answer["usage"]["completion_tokens"] == 3 and answer["choices"][0]["finish_reason"]
    assert _store_counts(tmp_path / "engine.duckdb")["requests"] == 1


def test_rollout_runs_its_phases_against_an_engine(installed):
    child, url = _engine(installed, "--gpu-blocks", "48")
    try:
        report = _json(installed, "rollout", "--endpoint", url, "--requests", "10",
                       "--concurrency", "1", "--max-tokens", "2", "--gpu-blocks", "48",
                       "--cpu-blocks", "64", "--cold-blocks", "0", "--json")
    finally:
        child.send_signal(signal.SIGTERM)
        child.wait(timeout=60)
    phases = [p["tiers"]["config_id"] for p in report["phases"]]
    assert phases[0] == "gpu-only" and len(phases) >= 2
    assert all(p["requests"] == 10 and p["errors"] == 0 for p in report["phases"])
