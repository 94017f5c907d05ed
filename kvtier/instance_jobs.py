"""Per-instance analyses of a fleet's trace, in worker processes (``--jobs``).

A store or a folder of segments may hold several serving instances, each with its own
prefix cache: ``simulate``, ``evaluate`` and ``recommend`` then analyse each instance on its
own and merge (``policy/fleet.py``). ``--jobs N`` runs N instances at a time in spawned
worker processes, each reading only its instance's segments; results come back in instance
order, so the output does not depend on N; ``--ray ADDRESS`` runs them as tasks on a Ray
cluster instead (:mod:`kvtier.ray_jobs`), with the same output. A verb whose per-instance
work is small (a
simulate replay is about a second per MiB of segments here) names ``min_parallel_bytes``:
below that much trace data the instances run in this process, since starting a worker
(a fresh interpreter importing numpy, DuckDB and kvtier) would cost more than it saves.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Callable, TypeVar

from kvtier.errors import KvtierError

R = TypeVar("R")


def fleet_instances(args) -> tuple[str, ...]:
    """The instances to analyse one by one: those of a store or segment folder holding more
    than one, unless ``--instance`` picks one; ``()`` for everything else."""
    jobs = getattr(args, "jobs", 1)
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise KvtierError(f"--jobs must be an int >= 1, got {jobs!r}")
    names = _instances(args)
    if (jobs > 1 or getattr(args, "ray", None)) and not names:
        how = f"--ray {args.ray}" if getattr(args, "ray", None) else f"--jobs {jobs}"
        print(f"note: {how} runs the instances of a store or segment folder in "
              "parallel; this trace is one instance, analysed in one process", file=sys.stderr)
    return names


def _instances(args) -> tuple[str, ...]:
    if getattr(args, "instance", None) or not args.trace:
        return ()
    path = Path(args.trace)
    if args.format not in (None, "store") or not path.exists():
        return ()
    if path.is_dir():
        from kvtier.collector.segments import segment_instances
        from kvtier.policy.readers import sniff_format

        if sniff_format(path) != "store":
            return ()
        names = segment_instances(path)
    elif path.suffix == ".duckdb":
        names = _store_instances(path)
    else:
        return ()
    return names if len(names) > 1 else ()


def _store_instances(path: Path) -> tuple[str, ...]:
    """The store's instances, read-only. A store that is locked, not kvtier's or of another
    schema is left to the reader, which reports it (or reads a running collector's segments)."""
    import duckdb

    from kvtier.collector.storefile import NotAStoreError, StoreLockedError, StoreSchemaError, connect

    try:
        con = connect(path, read_only=True)
    except (StoreLockedError, NotAStoreError, StoreSchemaError):
        return ()
    try:
        rows = con.execute("SELECT DISTINCT instance FROM ingested_batches WHERE requests > 0 "
                           "ORDER BY instance").fetchall()
    except duckdb.Error:
        return ()
    finally:
        con.close()
    return tuple(r[0] for r in rows)


def per_instance(function: Callable[[argparse.Namespace], R], args,
                 instances: tuple[str, ...], *, min_parallel_bytes: int = 0
                 ) -> list[tuple[str, R]]:
    """``function(args)`` once per instance (``args.instance`` set), ``args.jobs`` at a time;
    in this process when the trace holds fewer than ``min_parallel_bytes``; as Ray tasks
    when ``args.ray`` names a cluster.

    ``function`` must be importable by name (a module-level function), its result picklable.
    """
    copies = [argparse.Namespace(**{**vars(args), "instance": name}) for name in instances]
    if getattr(args, "ray", None):
        from kvtier.ray_jobs import ray_map

        results = ray_map(function, copies, args.ray, instances, time.monotonic())
        return list(zip(instances, results))
    jobs = min(args.jobs, len(instances))
    if jobs > 1 and min_parallel_bytes:
        size = trace_bytes(Path(args.trace))
        if size < min_parallel_bytes:
            print(f"note: --jobs {args.jobs}: {size / 2**20:.1f} MiB of trace is less work than "
                  f"starting workers (below {min_parallel_bytes / 2**20:g} MiB); analysed in "
                  "this process", file=sys.stderr)
            jobs = 1
    started = time.monotonic()
    if jobs == 1:
        results = []
        for i, copy in enumerate(copies):
            results.append(function(copy))
            _done(instances[i], i + 1, len(instances), started)
        return list(zip(instances, results))
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    threads = max(1, (os.cpu_count() or 1) // jobs)
    with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn"),
                             initializer=_worker_setup, initargs=(threads,)) as pool:
        futures = [pool.submit(function, copy) for copy in copies]
        results = []
        for i, future in enumerate(futures):
            results.append(future.result())  # a worker's KvtierError is raised here
            _done(instances[i], i + 1, len(instances), started)
    return list(zip(instances, results))


def trace_bytes(path: Path) -> int:
    """Bytes of a store file, or of the files under a segment folder."""
    if path.is_dir():
        return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    return path.stat().st_size


def _worker_setup(threads: int) -> None:
    # Before numpy/sklearn load: N workers with a full-width OpenMP/BLAS pool each would
    # oversubscribe the cores (OpenMP's spinning makes that far slower than one job).
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[name] = str(threads)
    from kvtier import progress

    progress.enabled = lambda: False  # one progress line per instance, from the parent


def _done(instance: str, done: int, total: int, started: float) -> None:
    print(f"instance {instance}: done ({done}/{total}, {time.monotonic() - started:.0f} s)",
          file=sys.stderr, flush=True)
