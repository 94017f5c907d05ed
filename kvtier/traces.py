"""Where the trace shipped with kvtier lies (see ``kvtier/data/README.md``). Standard library only."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

BUNDLED_TRACE_NAME = "mooncake_conversation_trace.jsonl.gz"


def bundled_trace() -> Path:
    """The Mooncake FAST'25 conversation trace (Apache-2.0), gzipped, inside the package."""
    return Path(str(resources.files("kvtier") / "data" / BUNDLED_TRACE_NAME))
