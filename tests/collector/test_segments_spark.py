"""The Parquet segments of several instances, read by Spark (pyspark in local mode, the JVM
on this machine) and by DuckDB: the same rows, the same per-tier token sums, the same
64-bit hashes. This is the fleet recipe: every collector exports into one shared folder and
any engine that reads Parquet with hive partitions queries the whole fleet."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from kvtier.collector.batch import EventBatch
from kvtier.collector.events import Origin, RequestRecord
from kvtier.collector.segments import export_segments, segments_relation
from kvtier.collector.store import TraceStore

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600),
              pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas")]

if shutil.which("java") is None:  # scripts/system-deps.sh installs a JRE
    pytest.skip("no Java runtime: Spark cannot start", allow_module_level=True)

DAY_S = 86_400.0
INSTANCES = ("node-a", "node-b")
TIERS = ("gpu_hit_tokens", "cpu_promotion_tokens", "cold_promotion_tokens", "recomputed_tokens")


def fill(store: TraceStore, instance: str, seed: int, segments) -> None:
    """Three days of a stream: block events as whole columns (as the vLLM tap builds them),
    requests as records, one batch per hour, exported to ``segments`` once a day."""
    rng = np.random.default_rng(seed)
    origin = Origin("vllm", instance, f"vllm-zmq:{instance}")
    for hour in range(72):
        n = int(rng.integers(200, 600))
        t0 = 19_675 * DAY_S + hour * 3600.0  # from a UTC midnight: three days
        kind = rng.choice([0, 1, 2, 3, 4, 5], n, p=[0.3, 0.2, 0.05, 0.2, 0.15, 0.1]).astype(np.int8)
        tier_to = np.select([kind == 0, kind == 1, kind == 2, kind == 4], [0, 0, 0, 1], -1)
        tier_from = np.select([kind == 1, kind == 2, kind == 4, kind == 5], [1, 2, 0, 1], -1)
        values = {"time_s": t0 + np.sort(rng.random(n)) * 3600, "kind": kind,
                  "block_hash": rng.integers(0, 2**64 - 1, n, dtype=np.uint64, endpoint=True),
                  "tokens": rng.choice([16, 32], n).astype(np.int32),
                  "tier_from": tier_from.astype(np.int8), "tier_to": tier_to.astype(np.int8)}
        values["block_hash"][0] = 2**64 - 1  # the largest uint64 must survive every engine
        nulls = {"tier_from": tier_from < 0, "tier_to": tier_to < 0}
        events = EventBatch.from_columns(origin, hour, values, nulls)
        requests = [RequestRecord(f"{instance}-{hour}-{i}", t0 + i, 512, 32,
                                  block_hashes=(int(rng.integers(0, 2**63)), 2**64 - 1),
                                  block_size_tokens=16,
                                  **{name: int(rng.integers(0, 128)) for name in TIERS})  # within the prompt
                    for i in range(int(rng.integers(20, 60)))]
        batch = EventBatch.from_rows(origin, hour, requests=requests)
        store.ingest(EventBatch(origin, hour, events.block_events, batch.requests))
        if hour % 24 == 23:
            export_segments(store, segments)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    root = tmp_path_factory.mktemp("fleet")
    for seed, instance in enumerate(INSTANCES):  # one collector (and store) per instance
        (root / instance).mkdir()
        with TraceStore(root / instance / "kvtier.duckdb") as store:
            fill(store, instance, seed, root / "segments")
    return (root / "segments").resolve()


def duckdb_figures(root) -> dict:
    import duckdb

    con = duckdb.connect()
    events, requests = segments_relation(root, "block_events"), segments_relation(root, "requests")
    sums = ", ".join(f"sum({t})" for t in TIERS)
    return {
        "requests": sorted(con.sql(f"SELECT instance, count(*), {sums} FROM {requests} "
                                   "GROUP BY instance").fetchall()),
        "events": sorted(con.sql(f"SELECT instance, CAST(kind AS VARCHAR), CAST(tier_to AS VARCHAR), "
                                 f"count(*), sum(tokens) FROM {events} GROUP BY ALL").fetchall(),
                         key=str),
        "hashes": con.sql(f"SELECT count(DISTINCT block_hash), max(block_hash), "
                          f"CAST(sum(block_hash) AS VARCHAR) FROM {events}").fetchall()[0],
        "days": con.sql(f"SELECT count(DISTINCT day) FROM {events}").fetchall()[0][0],
    }


def spark_figures(root) -> dict:
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    spark = (SparkSession.builder.master("local[1]").appName("kvtier-segments")
             .config("spark.ui.enabled", "false")
             .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.sql.shuffle.partitions", "2").config("spark.driver.memory", "1g")
             .getOrCreate())
    try:
        events = spark.read.parquet(str(root / "block_events"))
        requests = spark.read.parquet(str(root / "requests"))
        req = requests.groupBy("instance").agg(F.count("*"), *[F.sum(t) for t in TIERS]).collect()
        ev = events.groupBy("instance", "kind", "tier_to").agg(F.count("*"), F.sum("tokens")).collect()
        hashes = events.agg(F.countDistinct("block_hash"), F.max("block_hash"),
                            F.sum("block_hash")).collect()[0]
        return {
            "requests": sorted(tuple(r) for r in req),
            "events": sorted((tuple(r) for r in ev), key=str),
            "hashes": (hashes[0], int(hashes[1]), str(int(hashes[2]))),
            "days": events.select("day").distinct().count(),
        }
    finally:
        spark.stop()


def test_spark_and_duckdb_read_the_same_fleet_from_the_segments(fleet):
    expected = duckdb_figures(fleet)
    assert [r[0] for r in expected["requests"]] == list(INSTANCES)
    assert expected["days"] == 3 and expected["hashes"][1] == 2**64 - 1
    assert sum(r[3] for r in expected["events"]) > 20_000
    assert spark_figures(fleet) == expected
