"""Every benchmark still runs: each ``benchmarks/*.py`` that runs as a script (a
``__main__`` block; a module of shared helpers has none) is run with ``--json --smoke`` (tiny
inputs, seconds) and must print one JSON object holding the figures it declares (its
``FIGURES``). No timing is asserted: speed is what the benchmarks measure.

A benchmark that runs in an engine's environment names the variable that points at it
(``ENGINE_ENV``: ``KVTIER_VLLM_PYTHON`` or ``KVTIER_VLLM_CPU_PYTHON``, set by ``make test``)
and is skipped without it. One that only adds a serving vLLM where it finds one
(``VLLM_PYTHON``: the variable it reads) runs anyway, given the time an engine takes.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SERVING_ENGINE_ENV = "KVTIER_VLLM_CPU_PYTHON"  # starts serving vLLM engines: minutes


def declared(path: Path) -> dict:
    """The benchmark's module-level constants that are literals (``FIGURES``, ``ENGINE_ENV``)."""
    found = {}
    for node in ast.parse(path.read_text(), str(path)).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 \
                and isinstance(node.targets[0], ast.Name):
            try:
                found[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                pass
    return found


def runs_as_script(path: Path) -> bool:
    """Whether the module has an ``if __name__ == "__main__":`` block."""
    return any(isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
               and isinstance(node.test.left, ast.Name) and node.test.left.id == "__name__"
               for node in ast.parse(path.read_text(), str(path)).body)


def benchmarks() -> list:
    found = []
    for path in sorted((ROOT / "benchmarks").glob("*.py")):
        if not runs_as_script(path):
            continue
        constants = declared(path)
        slow = SERVING_ENGINE_ENV in (constants.get("ENGINE_ENV"), constants.get("VLLM_PYTHON"))
        marks = [pytest.mark.slow, pytest.mark.real_engine, pytest.mark.timeout(900)] if slow else []
        found.append(pytest.param(path, id=path.stem, marks=marks))
    return found


def test_the_benchmarks_are_found():
    found = {p.values[0].stem for p in benchmarks()}
    assert found >= {"ingest", "dashboard", "simulate", "live_curves", "sighting_filter",
                     "gpu_filter", "fleet_ray"}
    assert "vllm_side" not in found  # the vLLM-side benchmarks' shared helpers


@pytest.mark.parametrize("path", benchmarks())
def test_the_benchmark_runs_and_prints_its_figures(path: Path, tmp_path):
    constants = declared(path)
    figures = constants.get("FIGURES")
    assert figures, f"{path.name} declares no FIGURES (the keys of its --json object)"
    engine_env = constants.get("ENGINE_ENV")
    if engine_env and not os.environ.get(engine_env):
        pytest.skip(f"{path.name} runs in an engine's environment: ${engine_env} is not set")
    done = subprocess.run([sys.executable, str(path), "--json", "--smoke"], capture_output=True,
                          text=True, cwd=tmp_path, timeout=600)
    assert done.returncode == 0, f"{path.name} --json --smoke failed:\n{done.stderr[-3000:]}"
    try:
        result = json.loads(done.stdout)
    except json.JSONDecodeError as error:
        pytest.fail(f"{path.name} --json printed more than one JSON object ({error}):\n"
                    f"{done.stdout[-2000:]}")
    assert isinstance(result, dict), f"{path.name} --json printed {type(result).__name__}, not an object"
    missing = [name for name in figures if name not in result]
    assert not missing, f"{path.name} --json lacks {missing}; it printed {sorted(result)}"
