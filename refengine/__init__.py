"""kvtier's reference engine: a tiny decoder-only transformer over a tiered, paged KV cache.

Real attention over a real KV cache, real data movement between tiers (GPU pool -> CPU tier
-> one file per block), instrumented as kvtier instruments real engines: every block outcome
goes to a :class:`kvtier.collector.recorder.Recorder`, vLLM-format KV events go out over ZMQ, and a
vLLM-style ``/metrics`` subset is served. Small enough for two CPU cores.

The request path, file by file: ``config`` -> ``hashing`` -> ``sequence`` -> ``scheduler``
-> ``kv_manager`` (``gpu_pool``, ``cpu_tier``, ``file_tier``, ``kv_events``) -> ``model``
-> ``engine`` -> ``server``.

Serve it (the verb module is ``kvtier/verbs/engine.py``)::

    kvtier engine --port 8000 --gpu-blocks 48 --cpu-blocks 256 --cold-blocks 1024 \
        --file-dir /tmp/kvtier-files --kv-events tcp://127.0.0.1:5557 \
        --kv-events-replay tcp://127.0.0.1:5558 --store engine.duckdb

or in-process: ``EngineServer(EngineConfig(...), ServerSettings(port=0)).start()`` ... ``.stop()``;
or without HTTP: ``ReferenceEngine(config, recorder)``, ``submit(Sequence(...))``,
``step()`` until it returns ``False``. Switch tiers with ``POST /admin/tiers`` (JSON of ``TierConfig`` fields);
the switch applies once the running batch drains, and the caches start empty.
"""
