"""Benchmark only: time the vLLM engine core's steps that ran the model.

Put this folder on an engine's ``PYTHONPATH`` with ``KVTIER_STEP_TIMES=PREFIX``: when vLLM's
``vllm.v1.engine.core`` is imported, ``EngineCoreProc._process_engine_step`` is wrapped, and
the count, sum and sum of squares of the model-executing steps' wall times are written to
``PREFIX.<pid>`` every 20 steps. Both engines of a comparison run it, so it costs them alike.
"""

import importlib.abc
import importlib.machinery
import json
import os
import sys
import time

_PREFIX = os.environ.get("KVTIER_STEP_TIMES")


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "vllm.v1.engine.core":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None:
            return None
        inner = spec.loader

        class Loader(importlib.abc.Loader):
            def create_module(self, module_spec):
                return inner.create_module(module_spec)

            def exec_module(self, module):
                inner.exec_module(module)
                _wrap(module.EngineCoreProc)

        spec.loader = Loader()
        return spec


def _wrap(cls):
    step = cls._process_engine_step
    state = {"steps": 0, "sum_s": 0.0, "sum_sq_s2": 0.0}

    def timed(self):
        began = time.perf_counter()
        executed = step(self)
        if executed:
            took = time.perf_counter() - began
            state["steps"] += 1
            state["sum_s"] += took
            state["sum_sq_s2"] += took * took
            if state["steps"] % 20 == 0:
                with open(f"{_PREFIX}.{os.getpid()}", "w") as out:
                    json.dump(state, out)
        return executed

    cls._process_engine_step = timed


if _PREFIX:
    sys.meta_path.insert(0, _Finder())
