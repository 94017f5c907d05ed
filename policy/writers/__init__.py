"""Engine config writers: render :class:`kvtier.policy.writers.settings.EngineSettings` into each
engine's own config format (one module per engine, standard library only).

Each writer module has ``ENGINE``, ``FORMATS`` (file suffixes it edits), ``DEFAULT_FILE`` (the
name ``kvtier recommend`` writes), ``FILE_HELP`` (its files, for help texts), ``OFF`` (the
settings that turn offloading off, ``None`` where that is no setting), ``recommended(choices)``
(its engine's settings and notes from a recommendation's :class:`choices.Choices`),
``validate(settings)`` and ``render(settings, existing_text_or_None, suffix, *, force=False)
-> Rendered``;
rendering merges into the existing text and keeps everything kvtier does not own, and
refuses (``ValueError``) to replace what another product owns there unless ``force`` (vLLM:
a connector other than an offloading one; the other engines' files have no such part).

:data:`WRITERS` is the one registry of engines (a new writer is its module and its name on the line
below); ``kvtier push`` and ``kvtier recommend`` (choices, help), the report's file names and
the recommendation's engines read it.
"""

from __future__ import annotations

from types import ModuleType

from kvtier.policy.writers import dynamo, lmcache, sglang, trtllm, vllm

WRITERS: dict[str, ModuleType] = {m.ENGINE: m for m in (vllm, trtllm, lmcache, sglang, dynamo)}
ENGINES = tuple(WRITERS)


def writer(engine: str) -> ModuleType:
    """The writer module for ``engine``; ``ValueError`` naming the known engines."""
    try:
        return WRITERS[engine]
    except KeyError:
        raise ValueError(f"unknown engine {engine!r}; known: {', '.join(ENGINES)}") from None
