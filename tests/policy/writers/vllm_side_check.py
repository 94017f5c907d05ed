"""Runs in the vLLM side environment (official vllm==0.33.0 wheel): reads a JSON list of
cases on stdin and prints, for each, whether vLLM's own code accepts it.

Case kinds:
* ``{"kind": "transfer", "config": {...}}``: ``KVTransferConfig(**config)`` (pydantic); a
  connector given by module path is looked up by vLLM's ``KVConnectorFactory`` (an absent
  class stops vLLM at start-up); then the offloading spec named in
  ``kv_connector_extra_config`` is created by vLLM's ``OffloadingSpecFactory`` on a small
  stand-in model (one 16-token group) and asked for its scheduler-side manager, which is
  where vLLM checks ``cpu_bytes_to_use``, ``eviction_policy``, ``store_threshold`` and the
  secondary tiers. ``cpu_bytes_to_use`` is
  capped at 64 MiB for that step (it sizes a shared-memory region).
* ``{"kind": "yaml", "path": "..."}``: ``vllm serve --config PATH`` through vLLM's own
  argument parser and ``EngineArgs``; the transfer config vLLM runs with (after
  ``VllmConfig._post_init_kv_transfer_config`` applies ``--kv-offloading-size`` and
  ``--kv-offloading-backend``, as under ``vllm serve``, with this process's
  ``VLLM_USE_SIMPLE_KV_OFFLOAD``) is then checked as above, and the KV-events config is built
  as ``KVEventsConfig``. The result carries both, and ``runs``: the connector and size.
* ``{"kind": "post_init", "transfer": {...} | null, "size_gib": ..., "backend": ...,
  "simple": bool}``: just that method on those values; the result's ``runs``.

Not a test module: tests/policy/writers/test_vllm_configs_real.py spawns it.
"""

import json
import os
import sys
import tempfile

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")  # the CUDA wheel on a CPU-only machine


def check_transfer(raw: dict) -> None:
    from vllm.config.kv_transfer import KVTransferConfig
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.v1.kv_offload.config import (
        OffloadingCacheConfig, OffloadingConfig, OffloadingGroupConfig, OffloadingModelConfig,
        OffloadingParallelConfig,
    )
    from vllm.v1.kv_offload.factory import OffloadingSpecFactory

    transfer = KVTransferConfig(**raw)
    if transfer.kv_connector_module_path:
        KVConnectorFactory.get_connector_class(transfer)
    extra = dict(transfer.kv_connector_extra_config)
    if "cpu_bytes_to_use" in extra and isinstance(extra["cpu_bytes_to_use"], (int, float)):
        extra["cpu_bytes_to_use"] = min(extra["cpu_bytes_to_use"], 64 << 20)
    block_size = int(extra.get("block_size", 16))
    if block_size % 16:
        raise ValueError(f"block_size {block_size} is not a multiple of the GPU block size 16")
    config = OffloadingConfig(
        groups=(OffloadingGroupConfig(16, ("layer.0",), 0),), worker_kv_bytes_per_block=4096,
        enable_kv_cache_events=True, extra_config=extra, engine_id=next(tempfile._get_candidate_names()),
        model=OffloadingModelConfig("kvtier/check", "float16", 4096),
        cache=OffloadingCacheConfig(16, block_size // 16),
        parallel=OffloadingParallelConfig(0, 1, 1, 1, 1, 1, 0, 1, None, True))
    spec = OffloadingSpecFactory.create_spec(config)
    manager = spec.get_manager()
    manager.shutdown()


def post_init(transfer, size_gib, backend: str, simple: bool | None = None):
    """The transfer config vLLM runs with: ``VllmConfig._post_init_kv_transfer_config`` on a
    stand-in holding the two configs it reads (a whole ``VllmConfig`` needs a model)."""
    from types import SimpleNamespace

    from vllm.config import CacheConfig, KVTransferConfig, VllmConfig

    if isinstance(transfer, dict):
        transfer = KVTransferConfig(**transfer)
    holder = SimpleNamespace(cache_config=CacheConfig(kv_offloading_size=size_gib,
                                                      kv_offloading_backend=backend),
                             kv_transfer_config=transfer)
    saved = dict(os.environ)
    if simple is not None:
        os.environ["VLLM_USE_SIMPLE_KV_OFFLOAD"] = "1" if simple else "0"
    try:
        VllmConfig._post_init_kv_transfer_config(holder)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return holder.kv_transfer_config


def runs(transfer) -> dict | None:
    return None if transfer is None else {
        "connector": transfer.kv_connector, "module_path": transfer.kv_connector_module_path,
        "cpu_bytes_to_use": transfer.kv_connector_extra_config.get("cpu_bytes_to_use")}


def check_yaml(path: str) -> dict:
    import dataclasses

    from vllm.config import KVEventsConfig
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    engine_args = EngineArgs.from_cli_args(parser.parse_args(["--config", path]))
    transfer = post_init(engine_args.kv_transfer_config, engine_args.kv_offloading_size,
                         engine_args.kv_offloading_backend)
    check_transfer({"kv_connector": transfer.kv_connector, "kv_role": transfer.kv_role,
                    "kv_connector_module_path": transfer.kv_connector_module_path,
                    "kv_connector_extra_config": transfer.kv_connector_extra_config})
    events = engine_args.kv_events_config
    if isinstance(events, dict):
        events = KVEventsConfig(**events)
    return {"connector": [transfer.kv_connector, transfer.kv_connector_module_path],
            "extra": dict(transfer.kv_connector_extra_config), "runs": runs(transfer),
            "events": None if events is None else dataclasses.asdict(events)}


def main() -> None:
    results = []
    for case in json.load(sys.stdin):
        try:
            if case["kind"] == "transfer":
                check_transfer(case["config"])
                results.append({"ok": True})
            elif case["kind"] == "post_init":
                results.append({"ok": True, "runs": runs(post_init(
                    case["transfer"], case["size_gib"], case["backend"], case["simple"]))})
            else:
                results.append({"ok": True, **check_yaml(case["path"])})
        except (Exception, SystemExit) as exc:  # argparse exits on a bad value
            results.append({"ok": False, "error": f"{type(exc).__name__}: {str(exc)[:300]}"})
    print("RESULTS " + json.dumps(results), flush=True)


if __name__ == "__main__":
    main()
