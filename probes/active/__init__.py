"""Active probes: they generate load or move bytes to measure what the cost model needs.

``transfer`` (host<->device copies), ``fs`` (file-tier I/O), ``headroom`` (host memory a CPU
tier may take) and ``load`` (a trace-driven OpenAI client). Each returns an immutable result
with ``to_dict()`` (what ``kvtier probe ... --json`` prints).
"""
