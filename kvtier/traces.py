"""Where the traces shipped with kvtier lie (see ``kvtier/data/README.md``). Standard library only."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

BUNDLED_TRACE_NAME = "mooncake_conversation_trace.jsonl.gz"


def bundled_trace() -> Path:
    """The Mooncake FAST'25 conversation trace (Apache-2.0), gzipped, inside the package."""
    return Path(str(resources.files("kvtier") / "data" / BUNDLED_TRACE_NAME))


AGENTIC_TRACE_NAME = "weka_agentic_slice.tar.gz"


def bundled_agentic_trace() -> Path:
    """Sixteen agentic coding sessions from the kv-cache-tester traces (Apache-2.0), a WEKA
    format archive inside the package."""
    return Path(str(resources.files("kvtier") / "data" / AGENTIC_TRACE_NAME))
