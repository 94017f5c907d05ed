"""The live curves inside a running collector: fed by its ingest, served on its /metrics
(scraped over HTTP), written beside its segments at stop and read back; an observer that
fails never stops the ingest; the GPU size vLLM publishes on its /metrics is taken up."""

from __future__ import annotations

import re
import urllib.request

import pytest

from kvtier.collector.batch import EventBatch
from kvtier.collector.events import MetricInterval, Origin
from kvtier.collector.service import CollectorConfig, CollectorService
from kvtier.policy.livecurve.config import CurveConfig
from kvtier.policy.livecurve.curve_values import read_live_curves
from kvtier.policy.livecurve.live_curves import LiveCurves
from tests.conftest import FixedClock
from tests.policy.livecurve.fleet_traffic import fleet_batches, instance_requests

LADDER = (0, 768, 3072)
SERIES = re.compile(r'^kvtier_live_hit_ratio\{(?P<labels>[^}]*)\} (?P<value>\S+)$', re.M)


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as page:
        return page.read().decode()


def labels(text: str) -> dict:
    return dict(re.findall(r'(\w+)="([^"]*)"', text))


@pytest.fixture
def traffic():
    names = ("node-a", "node-b")
    fleet = {name: instance_requests(seed=i, requests=60, name=name) for i, name in enumerate(names)}
    return fleet, {"node-a": "vllm", "node-b": "reference"}


def service_with(tmp_path, observers, clock):
    config = CollectorConfig(store_path=tmp_path / "kvtier.duckdb", segments_dir=tmp_path / "segments",
                             metrics_port=0, instance="collector-1", export_every_s=3600)
    return CollectorService(config, observers=observers, clock=clock).start()


def test_the_collector_serves_each_instances_curve_and_writes_it_beside_its_segments(tmp_path, traffic):
    fleet, engines = traffic
    clock = FixedClock()
    curves = LiveCurves(CurveConfig(cpu_ladder_tokens=LADDER, gpu_tokens=1024), collector="collector-1",
                        clock=clock)
    service = service_with(tmp_path, [curves], clock)
    try:
        for batch in fleet_batches(fleet, engines):
            assert service.ingest(batch) is not None
            clock.advance(1.0)
        curves.flush()
        snapshot = curves.refresh()
        page = scrape(service.metrics.url)
    finally:
        service.stop()
    served = {(l["engine_instance"], l["window"], l["size_tokens"]): float(m["value"])
              for m in SERIES.finditer(page) if (l := labels(m["labels"]))}
    for one in snapshot.instances:
        assert one.window("all").requests == 60
        for point in one.window("all").points:
            assert served[(one.instance, "all", str(point.size_tokens))] == pytest.approx(point.hit_ratio)
    assert {k[1] for k in served} == {"300s", "3600s", "all"}
    assert 'kvtier_live_reach_bytes{engine="vllm",engine_instance="node-a",percent="90",window="all"}' in page
    assert "kvtier_observer_errors_total 0.0" in page
    written = read_live_curves(tmp_path / "segments")  # the file the stop wrote
    assert [(c.engine, c.instance) for c in written] == [("reference", "node-b"), ("vllm", "node-a")]
    assert written == tuple(sorted(snapshot.instances, key=lambda c: (c.engine, c.instance)))


class Broken:
    def observe(self, batch):
        raise RuntimeError("broken on purpose")

    def refresh(self):
        raise RuntimeError("broken on purpose")

    def flush(self):
        pass

    def samples(self):
        raise RuntimeError("broken on purpose")

    def export(self, folder):
        raise RuntimeError("broken on purpose")


def test_a_failing_observer_never_stops_the_ingest_nor_the_other_observers(tmp_path, traffic):
    fleet, engines = traffic
    clock = FixedClock()
    curves = LiveCurves(CurveConfig(cpu_ladder_tokens=LADDER, gpu_tokens=1024), collector="c",
                        clock=clock)
    service = service_with(tmp_path, [Broken(), curves], clock)
    try:
        results = [service.ingest(b) for b in fleet_batches(fleet, engines)]
        assert all(r is not None and not r.duplicate for r in results)
        assert service.store.count("requests") == 120
        page = scrape(service.metrics.url)
    finally:
        service.stop()
    errors = float(re.search(r"^kvtier_observer_errors_total (\S+)$", page, re.M).group(1))
    assert errors >= len(results)  # each observe, counted (and the page still served)
    assert "kvtier_block_events_total" in page or "kvtier_requests_total" in page
    assert all(c.window("all").requests == 60 for c in curves.snapshot().instances)


def test_the_gpu_size_vllm_publishes_is_taken_and_an_unsized_instance_says_why(traffic):
    fleet, _ = traffic
    clock = FixedClock()
    curves = LiveCurves(CurveConfig(cpu_ladder_tokens=LADDER), collector="c", clock=clock)
    scraped = EventBatch.from_intervals(Origin("vllm", "node-a", "http-scrape:node-a"), 0, [
        MetricInterval(1.0, 2.0, "vllm:cache_config_info", "gauge", 1.0,
                       'block_size="16",cache_dtype="auto",num_gpu_blocks="65"')])
    curves.observe(scraped)
    for batch in fleet_batches(fleet, {"node-a": "vllm", "node-b": "vllm"}):
        curves.observe(batch)
    curves.flush()
    found = {c.instance: c for c in curves.refresh().instances}
    assert found["node-a"].gpu_tokens == 64 * 16  # vLLM's null block left out
    assert found["node-a"].gpu_source.startswith("published by the engine")
    assert found["node-b"].gpu_tokens is None and found["node-b"].unsized_requests == 60
    assert "--curve-gpu-tokens" in found["node-b"].note
    samples = {(s.name, s.labels.get("engine_instance")): s.value for s in curves.samples()}
    assert samples[("kvtier_live_unsized_requests_total", "node-b")] == 60
