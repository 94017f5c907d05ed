"""Loading the compiled replay core (``policy/sim/_core.pyx``), with a useful error when a
checkout has not built it."""

from __future__ import annotations

from pathlib import Path

NEVER_ID = 2**63 - 1  # the core's next use of a block that is not referenced again

_core = None


def core():
    """The ``kvtier.policy.sim._core`` extension module."""
    global _core
    if _core is None:
        try:
            from kvtier.policy.sim import _core as module
        except ImportError as error:
            raise ImportError(
                f"the simulator's compiled core is not built in {Path(__file__).parent} "
                f"({error}); build it with `make ext` (or `python setup.py build_ext --inplace`) "
                f"in the checkout") from None
        _core = module
    return _core
