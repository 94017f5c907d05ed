"""Test-only offloading specs for vLLM's CPU platform, where vLLM's own offloading worker
refuses to run ("CPU Offloading is currently only supported on CUDA-alike and XPU GPUs",
``vllm/v1/kv_offload/cpu/spec.py`` ``get_worker``, vLLM 0.32).

``KvtierCopyWorkerSpec`` is kvtier's ``KvtierCPUOffloadingSpec`` and ``VllmCopyWorkerSpec`` is
vLLM's own ``CPUOffloadingSpec``, each with one change: the worker copies blocks between the
CPU KV cache and the host buffer with plain ``torch`` indexing, standing in for the CUDA copy
kernel. Everything else (the manager, the scheduler, the connector, the cache policy) is
vLLM's own code. vLLM loads them by module path (``spec_module_path``); the tests put this file
on the engine's ``PYTHONPATH`` under the name :data:`MODULE`.

A slow tier on purpose: with ``$KVTIER_TEST_LOAD_DELAY_FILE`` set, each load job first sleeps
the seconds that file holds (read at every job, so a test changes them while the engine
serves; a missing or empty file is no delay). The copy runs in the model step, as vLLM's
synchronous fallback does, so the delay holds up that step and every request in it.
"""

from __future__ import annotations

import functools
import os
import time

MODULE = "kvtier_test_copy_worker"
DELAY_VARIABLE = "KVTIER_TEST_LOAD_DELAY_FILE"


def load_delay_s() -> float:
    """The injected delay per load job (see module doc)."""
    path = os.environ.get(DELAY_VARIABLE)
    if not path:
        return 0.0
    try:
        return max(0.0, float(open(path).read().strip() or 0))
    except (OSError, ValueError):
        return 0.0


def _worker_class():
    import torch
    from vllm.v1.kv_offload.base import OffloadingWorker, TransferResult

    class CopyWorker(OffloadingWorker):
        """Synchronous row copies; results carry bytes and the copy's wall time."""

        def __init__(self, kv_caches, blocks_per_chunk: int, num_chunks: int):
            self.blocks_per_chunk = blocks_per_chunk
            self.refs = kv_caches.group_data_refs
            self.gpu, self.cpu = [], []
            for t in kv_caches.tensors:
                self.gpu.append(t.tensor.view(torch.int8).view(-1, t.page_size_bytes))
                self.cpu.append(torch.zeros((num_chunks * blocks_per_chunk, t.page_size_bytes),
                                            dtype=torch.int8))
            self.finished = []

        def _rows(self, gpu_spec, cpu_spec):
            """Per KV group: (GPU block rows, host sub-block rows), as vLLM's worker maps them
            (a chunk holds blocks_per_chunk blocks; a group may start inside its first chunk)."""
            gpu_ids, cpu_ids = list(gpu_spec.block_ids), list(cpu_spec.block_ids)
            rows, g_off, c_off = {}, 0, 0
            for group, (size, first) in enumerate(zip(gpu_spec.group_sizes, gpu_spec.block_indices)):
                if size == 0:
                    continue
                skip = first % self.blocks_per_chunk
                chunks = cpu_ids[c_off:c_off + -(-(size + skip) // self.blocks_per_chunk)]
                host = [chunks[(skip + i) // self.blocks_per_chunk] * self.blocks_per_chunk
                        + (skip + i) % self.blocks_per_chunk for i in range(size)]
                rows[group] = (gpu_ids[g_off:g_off + size], host)
                g_off, c_off = g_off + size, c_off + len(chunks)
            return rows

        def _copy(self, job_id, gpu_spec, cpu_spec, to_host: bool) -> bool:
            began, moved = time.perf_counter(), 0
            if not to_host and (delay_s := load_delay_s()):
                time.sleep(delay_s)  # a slow tier (module doc): part of the copy's time
            for group, (gpu_rows, host_rows) in self._rows(gpu_spec, cpu_spec).items():
                g, h = torch.tensor(gpu_rows), torch.tensor(host_rows)
                for t in sorted({ref.tensor_idx for ref in self.refs[group]}):
                    if to_host:
                        self.cpu[t][h] = self.gpu[t][g]
                    else:
                        self.gpu[t][g] = self.cpu[t][h]
                    moved += len(gpu_rows) * self.gpu[t].shape[1]
            self.finished.append(TransferResult(job_id, True, moved, time.perf_counter() - began))
            return True

        def submit_store(self, job_id, src_spec, dst_spec):
            return self._copy(job_id, src_spec, dst_spec, True)

        def submit_load(self, job_id, src_spec, dst_spec, expedited=False):  # 0.33 adds expedited
            return self._copy(job_id, dst_spec, src_spec, False)

        def get_finished(self):
            done, self.finished = self.finished, []
            return done

        def wait(self, job_ids):
            return None  # copies are synchronous

    return CopyWorker


@functools.cache
def _with_copy_worker(base):
    worker = _worker_class()

    class Spec(base):
        def get_worker(self, kv_caches):
            if getattr(self, "_copy_worker", None) is None:
                self._copy_worker = worker(kv_caches, self.blocks_per_chunk, self.num_chunks)
            return self._copy_worker

    Spec.__name__ = Spec.__qualname__ = f"{base.__name__}WithCopyWorker"
    return Spec


def __getattr__(name: str):
    # vLLM's OffloadingSpecFactory does getattr(import_module(spec_module_path), spec_name).
    if name == "KvtierCopyWorkerSpec":
        from kvtier.probes.vllm.spec import KvtierCPUOffloadingSpec

        return _with_copy_worker(KvtierCPUOffloadingSpec)
    if name == "VllmCopyWorkerSpec":
        from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec

        return _with_copy_worker(CPUOffloadingSpec)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
