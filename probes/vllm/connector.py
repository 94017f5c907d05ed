"""kvtier's vLLM connector: vLLM's own ``OffloadingConnector``, with per-request accounting
on the scheduler side (imports vLLM only when vLLM looks the class up).

Load it in place of vLLM's ``OffloadingConnector`` (same ``kv_connector_extra_config``, plus
the ``kvtier_*`` keys of ``probes/vllm/hook_settings.py``)::

    --kv-transfer-config '{"kv_connector": "KvtierOffloadingConnector",
      "kv_connector_module_path": "kvtier.probes.vllm.connector", "kv_role": "kv_both",
      "kv_connector_extra_config": {"spec_name": "KvtierCPUOffloadingSpec",
        "spec_module_path": "kvtier.probes.vllm.spec", "cpu_bytes_to_use": 10737418240,
        "kvtier_collector": "tcp://127.0.0.1:5570"}}'

What it records, and where each field comes from: ``probes/vllm/accounting.py``. Per-block
stores, evictions and promotions come from the spec wrapper (``probes/vllm/spec.py``), which
shares the engine's recorder. Only the scheduler-side instance records (the workers' instance
is vLLM's unchanged), and the recorder is shipped to ``kvtier collect --hooks`` by the
process's shipper; ``shutdown`` flushes it. Works with vLLM 0.32 and 0.33 (their connector
API is the same). Each scheduler step is recorded too, one ``StepRecord`` from the step's
``SchedulerOutput`` (``probes/vllm/step_accounting.py`` says where each field comes from;
the connector cannot see the waiting queue, so ``waiting_requests`` is 0). With kvtier's
learned cache policy (``probes/vllm/next_use_policy.py``) as ``eviction_policy``, each
finished request's record tells the policy how it ended. With a control token
(``kvtier_control_token``), kvtier's guardrail can pause the CPU tier's loads or stores and
recompute a prefix instead of loading it (``probes/vllm/tier_gate.py``): the state is taken
at each step boundary (``build_connector_meta``), a paused tier's hits are recomputed
(``get_num_new_matched_tokens`` answers no external tokens) and its stores declined. With
``kvtier_gpu_sightings`` the scheduler's GPU prefix cache keeps a block only from its N-th
request (``probes/vllm/gpu_filter.py``): the connector counts each request's blocks when the
scheduler first asks about it.
"""

from __future__ import annotations

import functools
import time


def __getattr__(name: str):
    # vLLM's KVConnectorFactory does getattr(import_module(kv_connector_module_path), name).
    if name == "KvtierOffloadingConnector":
        return _connector_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def served_model(model_config) -> str | None:
    """The name clients use for the model (the first served name), else its path."""
    name = getattr(model_config, "served_model_name", None) or getattr(model_config, "model", None)
    if isinstance(name, (list, tuple)):
        name = name[0] if name else None
    return name if isinstance(name, str) else None


def _output_tokens(request) -> int:
    return request.num_output_tokens


@functools.cache
def _connector_class():
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector import (
        OffloadingConnector,
    )

    from kvtier.probes.vllm.accounting import (
        RequestTokenAccounting,
        client_request_id,
        request_tags,
    )
    from kvtier.probes.vllm.recorders import close_receivers, flush, receiver_for, recorder_for
    from kvtier.probes.vllm import gpu_filter
    from kvtier.probes.vllm.hook_settings import HookSettings
    from kvtier.probes.vllm.next_use_policy import note_finished
    from kvtier.probes.vllm.step_accounting import StepAccounting
    from kvtier.probes.vllm.tier_gate import TierGate

    class KvtierOffloadingConnector(OffloadingConnector):
        """vLLM's OffloadingConnector with per-request accounting (see module doc)."""

        _kvtier_next_use = False  # kvtier's learned cache policy is the eviction_policy

        def __init__(self, vllm_config, role, kv_cache_config):
            super().__init__(vllm_config, role, kv_cache_config)
            self._kvtier = None
            if role != KVConnectorRole.SCHEDULER:
                return
            transfer = vllm_config.kv_transfer_config
            settings = HookSettings.from_extra_config(transfer.kv_connector_extra_config)
            self._kvtier_attach(settings, transfer.kv_connector_extra_config,
                                recorder_for(transfer.engine_id, settings),
                                vllm_config.cache_config.block_size,
                                model=served_model(vllm_config.model_config),
                                receiver=receiver_for(transfer.engine_id, settings))

        def _kvtier_attach(self, settings, extra: dict, recorder, block_size: int, *,
                           model=None, receiver=None, clock=time.time,
                           timer=time.perf_counter) -> None:
            """Every part kvtier's scheduler side keeps: the settings (read from the
            connector's extra config ``extra``), the token accounting, the step records, the
            guardrail's gate (the configured tiers without a control ``receiver``), the
            eviction policy's flag (from ``extra``) and the GPU prefix cache's sighting filter.
            ``__init__`` calls it; so do tests that build the connector without vLLM's config."""
            self._kvtier_settings = settings
            self._kvtier = RequestTokenAccounting(recorder, block_size, model=model, clock=clock)
            self._kvtier_steps = StepAccounting(recorder, clock=clock, timer=timer)
            self._kvtier_gate = TierGate(recorder, self._kvtier_settings.tier_config, receiver,
                                         clock=clock)
            self._kvtier_next_use = extra.get("eviction_policy") == "KvtierNextUsePolicy"
            if settings.gpu_sightings:
                gpu_filter.install(settings.gpu_sightings)

        def on_new_request(self, request):
            super().on_new_request(request)
            if self._kvtier is not None:
                self._kvtier.received(request.request_id, arrival_s=request.arrival_time,
                                      prompt_tokens=request.num_prompt_tokens)

        def get_num_new_matched_tokens(self, request, num_computed_tokens):
            if self._kvtier is not None:
                gpu_filter.sight(request)  # before allocation caches its blocks
            external, is_async = super().get_num_new_matched_tokens(request, num_computed_tokens)
            if self._kvtier is not None and external is not None:
                sources = self.get_external_cache_hit_sources(request, external) if external else {}
                sources = {getattr(s, "value", str(s)): n for s, n in sources.items()}
                reason = self._kvtier_reason(external, sources)
                fallback = (reason, external) if reason else ()
                if reason:  # recomputed: no external tokens (vLLM's lookup state stays sound)
                    external, is_async, sources = 0, False, {}
                self._kvtier.matched(
                    request.request_id, arrival_s=request.arrival_time,
                    prompt_tokens=request.num_prompt_tokens, gpu_tokens=num_computed_tokens,
                    sources=sources, fallback=fallback)
            return external, is_async

        def _kvtier_reason(self, external: int, sources: dict) -> str | None:
            if not external or self._kvtier_gate.applied.configured:
                return None
            observer = getattr(self._kvtier_manager(), "observer", None)
            jobs, queued = observer.load_queue() if observer is not None else (0, 0)
            per_token = (observer.chunk_bytes or 0) / (observer.chunk_tokens or 1) if observer else 0
            return self._kvtier_gate.recompute_reason(
                external, sum(n for s, n in sources.items() if s in ("disk", "p2p")), jobs,
                queued, int(external * per_token))

        def _kvtier_manager(self):
            return getattr(self.connector_scheduler, "manager", None)

        def update_state_after_alloc(self, request, blocks, num_external_tokens):
            result = super().update_state_after_alloc(request, blocks, num_external_tokens)
            if self._kvtier is not None:
                self._kvtier.admitted(request, request.request_id, num_external_tokens,
                                      request.block_hashes, self._kvtier_gate.tier_config)
                self._kvtier_steps.admitted(request.request_id, request.num_prompt_tokens)
            return result

        def build_connector_meta(self, scheduler_output):
            if self._kvtier is not None and self._kvtier_gate.step():  # a step boundary
                pause = getattr(self._kvtier_manager(), "pause_stores", None)
                if pause is not None:  # kvtier's spec: its stores can be declined
                    pause(self._kvtier_gate.stores_paused)
            meta = super().build_connector_meta(scheduler_output)
            if self._kvtier is not None:
                self._kvtier_steps.scheduled(scheduler_output, *self._kvtier_moved())
            return meta

        def _kvtier_moved(self) -> tuple[int, int]:
            # kvtier's spec wrapper counts the chunks this step's prepare_load/_store took
            take = getattr(getattr(self._kvtier_manager(), "observer", None), "take_step_bytes", None)
            return take() if take is not None else (0, 0)

        def take_events(self):
            # Called by the scheduler every step, after the step's output tokens are appended.
            if self._kvtier is not None:
                self._kvtier.step(_output_tokens)
                self._kvtier_steps.ended()
            return super().take_events()

        def _kvtier_finished(self, request) -> None:
            self._kvtier_steps.finished(request.request_id)
            status = getattr(request.status, "name", None)
            record = self._kvtier.finished(
                request.request_id, status=status, stop_reason=request.stop_reason,
                output_tokens=request.num_output_tokens,
                tags=self._kvtier_settings.tags(request_tags(
                    request.kv_transfer_params, getattr(request, "session_id", None)),
                    self._kvtier.tier_config(request.request_id)),
                client_request_id=client_request_id(
                    request.request_id, getattr(request, "external_req_id", None)))
            if record is not None and self._kvtier_next_use:
                note_finished(record.request_id, record.finish_status, record.stop_reason,
                              record.e2e_latency_s, record.output_tokens, record.prompt_tokens)

        def request_finished(self, request, block_ids):
            if self._kvtier is not None:
                self._kvtier_finished(request)
            return super().request_finished(request, block_ids)

        def request_finished_all_groups(self, request, block_ids):
            if self._kvtier is not None:
                self._kvtier_finished(request)
            return super().request_finished_all_groups(request, block_ids)

        def shutdown(self):
            if self._kvtier is not None:
                self._kvtier_steps.close()
                close_receivers()
            try:
                super().shutdown()
            finally:
                if self._kvtier is not None and self._kvtier_settings.shipper is not None:
                    flush(self._kvtier_settings.shipper.flush_timeout_s)

    return KvtierOffloadingConnector
