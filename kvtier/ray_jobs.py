"""A fleet's per-instance analyses as tasks on a Ray cluster (``--ray ADDRESS``), the
distributed twin of the local pool in :mod:`kvtier.instance_jobs`.

Each task runs the same module-level function on one instance (``args.instance`` set), on
whichever node the cluster picks, reading that instance's segments from the trace path: the
segment folder must be at the same path on every node (NFS, or a bucket mounted there; the
fleet recipe in README), and so must ``--out`` for ``recommend``, which each task writes
into (relative paths are taken from the driver's working folder, where a node has it).
Results come back in instance order, so the output is the local run's. Ray is an
optional dependency (``pip install 'kvtier[ray]'``); vLLM's own environments already have it.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

from kvtier.errors import KvtierError

R = TypeVar("R")
# each task one CPU, its math libraries one thread (as the local pool's workers): N tasks on
# N cores do not fight over OpenMP/BLAS pools
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def ray_map(function: Callable[[object], R], jobs: Sequence[object], address: str,
            names: Sequence[str], started: float) -> list[R]:
    """``function(job)`` for each job as a Ray task on the cluster at ``address`` (``auto``:
    the one this machine belongs to); ``names`` label the progress lines. A task's
    :class:`KvtierError` is raised here as it is; a cluster that cannot be reached is one."""
    ray = _ray()
    connected_here = not ray.is_initialized()
    if connected_here:
        try:
            ray.init(address=address, log_to_driver=False, logging_level="ERROR",
                     runtime_env={"env_vars": {**{v: "1" for v in THREAD_VARIABLES},
                                               "PYTHONPATH": _checkout_path()}})
        except (ConnectionError, RuntimeError, ValueError) as error:
            raise KvtierError(f"--ray {address}: cannot reach a Ray cluster there ({error}); "
                              "start one (ray start --head) or give its address "
                              "(host:port, or auto)") from None
    try:
        task = ray.remote(num_cpus=1)(_task)
        here = os.getcwd()  # relative paths mean the same on every node (a shared folder)
        pending = {task.remote(function, job, here): i for i, job in enumerate(jobs)}
        results: list = [None] * len(jobs)
        while pending:
            (ready,), _ = ray.wait(list(pending), num_returns=1)
            index = pending.pop(ready)
            results[index] = _result(ray, ready)
            _done(names[index], len(jobs) - len(pending), len(jobs), started)
        return results
    finally:
        if connected_here:
            ray.shutdown()


def _task(function: Callable[[object], R], job: object, cwd: str) -> R:
    from kvtier import progress

    progress.enabled = lambda: False  # one progress line per instance, from the driver
    if os.path.isdir(cwd):
        os.chdir(cwd)
    return function(job)


def _result(ray, ref):
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as error:
        cause = error.cause if isinstance(getattr(error, "cause", None), BaseException) else None
        if isinstance(cause, KvtierError):
            raise cause from None
        raise


def _ray():
    try:
        import ray
    except ImportError:
        raise KvtierError("--ray needs Ray, an optional dependency: pip install 'kvtier[ray]' "
                          "(or run with --jobs N on this machine)") from None
    return ray


def _checkout_path() -> str:
    """The folder that holds the ``kvtier`` package, for tasks on a node running a checkout
    the way this process does (an installed kvtier finds itself anyway)."""
    import kvtier

    here = os.path.dirname(os.path.dirname(os.path.abspath(kvtier.__file__)))
    return os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH", "")) if p)


def _done(instance: str, done: int, total: int, started: float) -> None:
    print(f"instance {instance}: done ({done}/{total}, {time.monotonic() - started:.0f} s, Ray)",
          file=sys.stderr, flush=True)
