"""The recorders of one engine process: one :class:`collector.recorder.Recorder` per engine.

vLLM builds kvtier's spec, connector and cache policy by module path inside its own processes,
with no channel to hand them a recorder; they find their engine's here by ``engine_id``.
"""

from __future__ import annotations

import threading
import time

from collector.events import Origin

_RECORDERS: dict[str, object] = {}
_RECORDERS_LOCK = threading.Lock()


def recorder_for(engine_id: str, instance: str | None = None, *, clock=time.time):
    """The process-wide recorder of one engine (created on first use)."""
    from collector.recorder import Recorder

    with _RECORDERS_LOCK:
        recorder = _RECORDERS.get(engine_id)
        if recorder is None:
            source = f"vllm-hooks:{instance or engine_id}:{engine_id}:{int(clock() * 1000)}"
            recorder = Recorder(Origin("vllm", instance or engine_id, source), clock=clock)
            _RECORDERS[engine_id] = recorder
        return recorder


def active_recorders() -> dict[str, object]:
    """engine_id -> recorder, for whatever drains them."""
    with _RECORDERS_LOCK:
        return dict(_RECORDERS)
