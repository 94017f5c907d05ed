"""kvtier's reference engine: a tiny decoder-only transformer over a tiered, paged KV cache.

Real attention over a real KV cache, real data movement between tiers (GPU pool -> CPU tier
-> one file per block), instrumented as kvtier instruments real engines: every block outcome
goes to a :class:`collector.recorder.Recorder`, vLLM-format KV events go out over ZMQ, and a
vLLM-style ``/metrics`` subset is served. Small enough for two CPU cores.

The request path, file by file: ``config`` -> ``hashing`` -> ``sequence`` -> ``scheduler``
-> ``kv_manager`` (``gpu_pool``, ``cpu_tier``, ``file_tier``, ``kv_events``) -> ``model``
-> ``engine`` -> ``server``.
"""
