"""The compiled extensions (Cython, built ahead of time at install); everything else about the
package is in pyproject.toml. Build them in place in a checkout with ``make ext``. One list for
every package: add an ``Extension`` per ``.pyx`` here."""

from Cython.Build import cythonize
from setuptools import Extension, setup

# Python's own CFLAGS carry -g: debug info for generated C more than doubles the compile (it
# dominated a fresh `make demo`'s install), and nobody steps through it; -g0 comes last, so wins.
NO_DEBUG_INFO = ["-g0"]

EXTENSIONS = [
    # vLLM KV-event payloads -> block-event columns (the collector's vLLM tap)
    Extension("probes.vllm.wire_columns", ["probes/vllm/wire_columns.pyx"], language="c++",
              extra_compile_args=NO_DEBUG_INFO),
    # the simulator's replay core: tiers, policies, admitters, flows (includes policy/sim/_*.pxi)
    # -ffp-contract=off: no fused multiply-add, so its float arithmetic is Python's to the bit
    Extension("policy.sim._core", ["policy/sim/_core.pyx"],
              extra_compile_args=["-O2", "-ffp-contract=off", *NO_DEBUG_INFO]),
]

setup(ext_modules=cythonize(EXTENSIONS, language_level=3),
      options={"build_ext": {"parallel": 2}})  # the extensions compile side by side
