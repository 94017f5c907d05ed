"""Loading the learned models' compiled kernels (``policy/learn/_kernels.pyx``: the feature
tracker and offer log, learned retention, the forest, the next-use order and its shadow),
which run inside the replay core's flows through the core's declared tier protocol."""

from __future__ import annotations

from types import ModuleType

from kvtier.policy.sim.compiled import load_extension


def kernels() -> ModuleType:
    """The ``kvtier.policy.learn._kernels`` extension module."""
    return load_extension("kvtier.policy.learn._kernels", "the learned models' compiled kernels")
