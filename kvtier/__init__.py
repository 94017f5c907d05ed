"""kvtier: observability and policy tuning for tiered KV caches in LLM serving.

This package is the command line and the demo that ties the parts together; the parts live
in the top-level packages ``collector``, ``policy``, ``probes`` and ``dashboard``.
"""

__version__ = "0.1.0"
