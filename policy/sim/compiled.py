"""Loading the compiled extensions (the replay core, ``policy/sim/_core.pyx``, and the learned
models' kernels, ``policy/learn/_kernels.pyx``), with a useful error when a checkout has not
built them."""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

NEVER_ID = 2**63 - 1  # the core's next use of a block that is not referenced again

_loaded: dict[str, ModuleType] = {}


def load_extension(name: str, what: str) -> ModuleType:
    """The compiled module ``name`` (``what`` it is, for the error when it is not built)."""
    module = _loaded.get(name)
    if module is None:
        try:
            module = importlib.import_module(name)
        except ImportError as error:
            folder = Path(__file__).parents[1] / Path(*name.split(".")[2:-1])
            raise ImportError(
                f"{what} is not built in {folder} ({error}); build it with `make ext` (or "
                f"`python setup.py build_ext --inplace`) in the checkout") from None
        _loaded[name] = module
    return module


def core() -> ModuleType:
    """The ``kvtier.policy.sim._core`` extension module."""
    return load_extension("kvtier.policy.sim._core", "the simulator's compiled core")
