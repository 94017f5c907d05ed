"""The files the bad-input suite feeds kvtier: good ones to break, and broken ones.

``build(root)`` writes them once per test session; every case then runs in its own copy, so
a case that changed a file cannot hide it from the next. Everything is made here from the
Mooncake slice bundled in the package (no ``../shared``).
"""

from __future__ import annotations

import gzip
import io
import itertools
import json
import shutil
import tarfile
from pathlib import Path

import duckdb

from kvtier.collector.batch import EventBatch
from kvtier.collector.events import Origin
from kvtier.collector.segments import export_segments
from kvtier.collector.store import TraceStore
from kvtier.policy.recommend.recommendation import KIND, VERSION
from kvtier.traces import bundled_trace

GiB = 1 << 30


def build(root: Path) -> Path:
    traces(root / "traces")
    stores(root / "stores", root / "traces" / "mc300.jsonl")
    recommendations(root / "reco")
    configs(root / "configs")
    return root


def traces(out: Path) -> None:
    out.mkdir(parents=True)
    with gzip.open(bundled_trace(), "rt") as bundled:
        lines = list(itertools.islice(bundled, 300))
    (out / "mc300.jsonl").write_text("".join(lines))
    (out / "empty.jsonl").write_text("")
    (out / "blank.jsonl").write_text("\n\n  \n")
    (out / "empty.jsonl.gz").write_bytes(gzip.compress(b""))
    whole = gzip.compress("".join(lines).encode())
    (out / "truncated.jsonl.gz").write_bytes(whole[: len(whole) // 2])
    broken = list(lines[:150])
    broken[100] = json.dumps({**json.loads(lines[100]), "input_length": "many"}) + "\n"
    (out / "badtype-line101.jsonl").write_text("".join(broken))
    broken = list(lines[:60])
    broken[49] = '{"timestamp": 1, "input_length": 5\n'
    (out / "badjson-line50.jsonl").write_text("".join(broken))
    broken = list(lines[:20])
    broken[9] = json.dumps({"timestamp": 1, "input_length": 100}) + "\n"
    (out / "missing-line10.jsonl").write_text("".join(broken))
    broken = list(lines[:20])
    broken[7] = json.dumps({**json.loads(lines[7]), "hash_ids": [1, 2]}) + "\n"
    (out / "hashcount-line8.jsonl").write_text("".join(broken))
    (out / "notjson.jsonl").write_text("hello world\nthis is not json\n")
    (out / "binary.bin").write_bytes(bytes(range(256)) * 8)
    (out / "trace.csv").write_text("a,b\n1,2\n")
    (out / "emptydir").mkdir()
    conversation = {"id": "c1", "block_size": 64, "hash_id_scope": "local", "requests": [
        {"t": float(t), "type": "n", "in": 64 * (t + 1), "out": 5, "hash_ids": list(range(1, t + 2))}
        for t in range(6)]}
    (out / "weka.json").write_text(json.dumps(conversation))
    (out / "weka-no-requests.json").write_text(json.dumps({**conversation, "requests": []}))
    bad = json.loads(json.dumps(conversation))
    bad["requests"][3]["in"] = "lots"
    (out / "weka-badtype.json").write_text(json.dumps(bad))
    archive = _tar({"c1.json": json.dumps(conversation).encode(), "c2.json": b'{"id": "c2", "requests": [{"t"'})
    (out / "weka-corrupt-member.tar.gz").write_bytes(archive)
    good = _tar({"c1.json": json.dumps(conversation).encode()})
    (out / "weka-truncated.tar.gz").write_bytes(good[: len(good) // 2])
    (out / "weka-nothing.tar.gz").write_bytes(_tar({"notes.txt": b"abc"}))


def _tar(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as archive:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def stores(out: Path, trace: Path) -> None:
    """kvtier.duckdb with segments/ beside it (what a collector with --segments leaves), a
    store without segments, an older-schema store, and files that are not kvtier stores."""
    from kvtier.policy.readers import open_trace

    out.mkdir()
    records = list(open_trace(trace).requests())[:120]
    origin = Origin("reference", "node-1", "bad-input-suite")
    for name in ("kvtier.duckdb", "lonely/kvtier.duckdb", "older.duckdb"):
        (out / name).parent.mkdir(exist_ok=True)
        with TraceStore(out / name, clock=lambda: 1_800_000_000.0) as store:
            for k in range(3):
                store.ingest(EventBatch.from_rows(origin, k, requests=records[40 * k:40 * (k + 1)]))
            if name == "kvtier.duckdb":
                export_segments(store, out / "segments")
    con = duckdb.connect(str(out / "older.duckdb"))  # as an older kvtier wrote it
    con.execute("DROP VIEW requests_with_origin")
    for column in ("finish_status", "stop_reason", "model"):
        con.execute(f"ALTER TABLE requests DROP COLUMN {column}")
    con.close()
    (out / "text.duckdb").write_text("hello, I am not a database\n")
    (out / "zero.duckdb").write_bytes(b"")
    (out / "truncated.duckdb").write_bytes((out / "kvtier.duckdb").read_bytes()[:8192])
    con = duckdb.connect(str(out / "foreign.duckdb"))
    con.execute("CREATE TABLE invoices (id INTEGER, amount DOUBLE)")
    con.execute("INSERT INTO invoices VALUES (1, 9.5)")
    con.close()
    con = duckdb.connect(str(out / "other-schema.duckdb"))
    con.execute("CREATE TABLE requests (arrival_s DOUBLE, request_id VARCHAR)")
    con.close()
    duckdb.connect(str(out / "empty-db.duckdb")).close()
    (out / "not.parquet").write_text("PAR1 not really")
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"arrival_s": [1.0, 2.0]}), out / "existing.parquet")
    damaged = out / "damaged-segments"
    for source in (out / "segments").rglob("*.parquet"):
        target = damaged / source.relative_to(out / "segments")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(source.read_bytes()[:100])
    (out / "no-segments").mkdir()
    changed = out / "schema-changed-segments"
    shutil.copytree(out / "segments", changed)
    first = sorted((changed / "requests").rglob("*.parquet"))[0]
    rows = pq.read_table(first)  # one file whose prompt_tokens another program wrote as text
    index = rows.schema.get_field_index("prompt_tokens")
    pq.write_table(rows.set_column(index, "prompt_tokens", rows.column(index).cast(pa.string())), first)


def recommendations(out: Path) -> None:
    out.mkdir()
    vllm = {"cpu_tier_bytes": GiB, "eviction_policy": "lru", "store_threshold": 0, "kv_events": True}
    trt = {"cpu_tier_bytes": GiB, "offload_min_priority": 20, "kv_events": True}
    lmcache = {"cpu_tier_bytes": GiB, "eviction_policy": "lru"}
    head = {"kind": KIND, "version": VERSION}
    evidence = {"verdict": "offload", "engines": {"vllm": vllm, "trtllm": trt, "lmcache": lmcache}}
    write = lambda name, doc: (out / name).write_text(json.dumps(doc, indent=2) + "\n")  # noqa: E731
    write("recommendation.json", {**head, "settings": {"cpu_tier_bytes": GiB, "offload_min_priority": 20},
                                  "guardrails": {}, "evidence": evidence})
    write("recommendation.vllm.json", {**head, "engine": "vllm", "settings": vllm, "evidence": evidence})
    write("recommendation.trtllm.json", {**head, "engine": "trtllm", "settings": trt, "evidence": evidence})
    write("huge-cpu.json", {"settings": {"cpu_tier_bytes": 610 * GiB}})
    write("bad-type.json", {"settings": {"cpu_tier_bytes": "lots"}})
    write("negative.json", {"settings": {"cpu_tier_bytes": -5}})
    write("unknown-setting.json", {"settings": {"cpu_tier_gb": 4}})
    write("unknown-key.json", {"setings": {}, "settings": {}})
    write("bad-guardrail.json", {"settings": {"cpu_tier_bytes": GiB}, "guardrails": {"host_ram": 5}})
    write("bad-policy.json", {"settings": {"cpu_tier_bytes": GiB, "eviction_policy": "mru"}})
    write("array.json", [1, 2])
    (out / "notjson.json").write_text("cpu_tier_bytes: 5\n")
    (out / "truncated.json").write_text((out / "recommendation.vllm.json").read_text()[:60])
    (out / "empty.json").write_text("")
    (out / "cost-inf.json").write_text('{"probe": "calibrate", "cost_params": {"prefill_tokens_per_s": 1e999}}\n')
    (out / "cost-negative.json").write_text('{"probe": "calibrate", "cost_params": {"cpu_gpu_op_latency_s": -0.001}}\n')


def configs(out: Path) -> None:
    out.mkdir()
    files = {
        "vllm.json": '{"kv_connector": "OffloadingConnector", "kv_role": "kv_both"}\n',
        "vllm.yaml": "# serving config\nmodel: m   # the model\nkv_transfer_config: '{}'\n",
        "dupes.yaml": "model: a\nport: 8000\nport: 8001\n",
        "both-spellings.yaml": "model: a\nkv-transfer-config: '{}'\nkv_transfer_config: '{}'\n",
        "invalid.yaml": "model: [unclosed\n  port: 8000\n",
        "tabs.yaml": "model: a\n\tport: 8000\n",
        "list.yaml": "- a\n- b\n",
        "mixed-indent.yaml": "a:\n  b: 1\nc:\n    d: 1\n",
        "invalid.json": '{"kv_connector": "OffloadingConnector",\n',
        "array.json": "[1, 2]\n",
        "vllm.txt": "whatever\n",
        "trtllm-dashes.yaml": "kv_cache_config:\n  host-cache-size: 2\n",
        "lmcache-dashes.yaml": "chunk_size: 256\nmax-local-cpu-size: 5\n",
        "sglang.args": "--model-path a\n",
    }
    for name, text in files.items():
        (out / name).write_text(text)
    (out / "binary.yaml").write_bytes(bytes(range(128, 256)))
    (out / "adir.yaml").mkdir()
