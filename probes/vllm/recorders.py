"""The recorders of one engine process: one :class:`kvtier.collector.recorder.Recorder` per engine.

vLLM builds kvtier's spec, connector and cache policy by module path inside its own processes,
with no channel to hand them a recorder; they find their engine's here by ``engine_id``. A
recorder is shipped to the collector by this process's shipper (``collector/shipper.py``)
from the moment it is created, unless the settings say ``in-process``. An engine whose
settings carry a control token listens to the collector's control channel through one
receiver (``collector/control_receiver.py``), found here the same way.
"""

from __future__ import annotations

import threading
import time

from kvtier.collector.events import Origin
from kvtier.probes.vllm.hook_settings import HookSettings

_RECORDERS: dict[str, object] = {}
_RECORDERS_LOCK = threading.Lock()


def recorder_for(engine_id: str, settings: HookSettings = HookSettings(), *, clock=time.time):
    """The process-wide recorder of one engine (created, and shipped, on first use)."""
    from kvtier.collector.recorder import Recorder
    from kvtier.collector.shipper import ship, wake_on_sigterm

    with _RECORDERS_LOCK:
        recorder = _RECORDERS.get(engine_id)
        if recorder is None:
            instance = settings.instance or engine_id
            source = f"vllm-hooks:{instance}:{engine_id}:{int(clock() * 1000)}"
            recorder = Recorder(Origin("vllm", instance, source), clock=clock)
            _RECORDERS[engine_id] = recorder
            if settings.shipper is not None:
                ship(recorder, settings.shipper)
                wake_on_sigterm()  # a SIGTERM starts the flush before vLLM tears down
        return recorder


_RECEIVERS: dict[str, object] = {}


def receiver_for(engine_id: str, settings: HookSettings):
    """The process-wide control receiver of one engine (``None`` without a control token),
    started on first use; its drops are counted in the engine's recorder."""
    if settings.control is None:
        return None
    from kvtier.collector.control_receiver import ControlReceiver

    recorder = recorder_for(engine_id, settings)
    with _RECORDERS_LOCK:
        receiver = _RECEIVERS.get(engine_id)
        if receiver is None:
            config = settings.control.receiver(recorder.origin.instance)
            receiver = _RECEIVERS[engine_id] = ControlReceiver(
                config, recorder.guardrail_rejected).start()
        return receiver


def close_receivers() -> None:
    """Stop this process's control receivers (engine shutdown)."""
    with _RECORDERS_LOCK:
        receivers = list(_RECEIVERS.values())
        _RECEIVERS.clear()
    for receiver in receivers:
        receiver.close()


def flush(timeout_s: float | None = None) -> None:
    """Ship what this process's recorders hold, bounded (engine shutdown)."""
    from kvtier.collector.shipper import flush_all

    flush_all(timeout_s)
