"""The package map and the compiled extensions; everything else about the package is in
pyproject.toml.

One import namespace: the repository keeps its parts in top-level folders (``collector/``,
``policy/``, ``probes/``, ``dashboard/``, ``refengine/``) beside the command line (``kvtier/``),
and the build installs each of them under ``kvtier`` (``collector/`` -> ``kvtier.collector``), so
an installed kvtier is one top-level package and clashes with nothing (an engine's environment
may well hold another ``collector``). A checkout resolves the same names through
``kvtier/__init__.py``.

The extensions are Cython, built ahead of time at install; build them in place in a checkout
with ``make ext``. One list for every package: add an ``Extension`` per ``.pyx`` here."""

from pathlib import Path

from Cython.Build import cythonize
from setuptools import Extension, find_packages, setup

# the folders installed under the kvtier namespace (kvtier/__init__.py names the same ones)
PARTS = ("collector", "policy", "probes", "refengine", "dashboard")


def namespace() -> tuple[list[str], dict[str, str]]:
    """(every package's installed name, the folder of each top-level part)."""
    packages = ["kvtier", *(f"kvtier.{sub}" for sub in find_packages("kvtier"))]
    for part in PARTS:
        packages += [f"kvtier.{part}", *(f"kvtier.{part}.{sub}" for sub in find_packages(part))]
    return packages, {"kvtier": "kvtier", **{f"kvtier.{part}": part for part in PARTS}}


# Python's own CFLAGS carry -g: debug info for generated C more than doubles the compile (it
# dominated a fresh `make demo`'s install), and nobody steps through it; -g0 comes last, so wins.
NO_DEBUG_INFO = ["-g0"]

EXTENSIONS = [
    # vLLM KV-event payloads -> block-event columns (the collector's vLLM tap)
    Extension("kvtier.probes.vllm.wire_columns", ["probes/vllm/wire_columns.pyx"], language="c++",
              extra_compile_args=NO_DEBUG_INFO),
    # the simulator's replay core: tiers, policies, admitters, flows (includes policy/sim/_*.pxi;
    # the tier protocol it shares is declared in policy/sim/_core.pxd)
    # -ffp-contract=off: no fused multiply-add, so its float arithmetic is Python's to the bit
    Extension("kvtier.policy.sim._core", ["policy/sim/_core.pyx"],
              extra_compile_args=["-O2", "-ffp-contract=off", *NO_DEBUG_INFO]),
    # the learned models' kernels (includes policy/learn/_*.pxi), cimporting the core's protocol
    Extension("kvtier.policy.learn._kernels", ["policy/learn/_kernels.pyx"],
              extra_compile_args=["-O2", "-ffp-contract=off", *NO_DEBUG_INFO]),
    # the collector's live what-if curves: online stack distances per instance
    Extension("kvtier.policy.livecurve._recency", ["policy/livecurve/_recency.pyx"],
              extra_compile_args=["-O2", *NO_DEBUG_INFO]),
]


def cimport_root() -> str:
    """A folder where the parts' ``.pxd`` files sit under their installed names.

    Cython finds ``cimport kvtier.policy.sim._core`` by package path (``kvtier/policy/sim/
    _core.pxd``), but the checkout keeps the part in ``policy/``; links under ``build/`` give
    each part its ``kvtier`` name."""
    root = Path("build", "cimport")
    (root / "kvtier").mkdir(parents=True, exist_ok=True)
    (root / "kvtier" / "__init__.pxd").touch()
    for part in PARTS:
        link, target = root / "kvtier" / part, Path(part).resolve()
        if link.is_symlink() and link.resolve() != target:
            link.unlink()   # a link left by another checkout
        if not link.is_symlink():
            link.symlink_to(target, target_is_directory=True)
    return str(root)


PACKAGES, PACKAGE_DIR = namespace()
setup(packages=PACKAGES, package_dir=PACKAGE_DIR,
      ext_modules=cythonize(EXTENSIONS, language_level=3, include_path=[cimport_root()]),
      options={"build_ext": {"parallel": 2}})  # the extensions compile side by side
