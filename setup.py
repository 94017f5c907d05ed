"""The compiled extensions (Cython, built ahead of time at install); everything else about the
package is in pyproject.toml. Build them in place in a checkout with ``make ext``. One list for
every package: add an ``Extension`` per ``.pyx`` here."""

from Cython.Build import cythonize
from setuptools import Extension, setup

EXTENSIONS = [
    # vLLM KV-event payloads -> block-event columns (the collector's vLLM tap)
    Extension("probes.vllm.wire_columns", ["probes/vllm/wire_columns.pyx"], language="c++"),
    # the simulator's replay core: tiers, policies, admitters, flows (includes policy/sim/_*.pxi)
    Extension("policy.sim._core", ["policy/sim/_core.pyx"], extra_compile_args=["-O2"]),
]

setup(ext_modules=cythonize(EXTENSIONS, language_level=3))
