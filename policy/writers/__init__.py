"""Engine config writers: render :class:`kvtier.policy.writers.settings.EngineSettings` into each
engine's own config format (one module per engine, standard library only).

Each writer module has ``ENGINE``, ``FORMATS`` (file suffixes it edits), ``validate(settings)``
and ``render(settings, existing_text_or_None, suffix, *, force=False) -> Rendered``;
rendering merges into the existing text and keeps everything kvtier does not own, and
refuses (``ValueError``) to replace what another product owns there unless ``force`` (vLLM:
a connector other than an offloading one; the other engines' files have no such part).
"""

from __future__ import annotations

import importlib
from types import ModuleType

ENGINES = ("vllm", "trtllm", "lmcache", "sglang", "dynamo")


def writer(engine: str) -> ModuleType:
    """The writer module for ``engine``; ``ValueError`` naming the known engines."""
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}; known: {', '.join(ENGINES)}")
    return importlib.import_module(f"kvtier.policy.writers.{engine}")
