"""One pure-Python eviction policy per module, each the oracle of the compiled policy registered
under the same ``name``. A module here is found by itself: :data:`POLICIES` holds every
:class:`CachePolicy` subclass the package's modules define, by name, so an oracle joins
``test_core_vs_oracle.py`` by being written here."""

from __future__ import annotations

import importlib
import pkgutil

from kvtier.policy.sim.policies.base import CachePolicy


def _discovered() -> dict[str, type[CachePolicy]]:
    found: dict[str, type[CachePolicy]] = {}
    for module_info in pkgutil.iter_modules(__path__):
        module = importlib.import_module(f"{__name__}.{module_info.name}")
        for value in vars(module).values():
            if isinstance(value, type) and issubclass(value, CachePolicy) \
                    and value.__module__ == module.__name__ and value.name != CachePolicy.name:
                if value.name in found:
                    raise ValueError(f"two oracles named {value.name!r}: "
                                     f"{found[value.name].__qualname__}, {value.__qualname__}")
                found[value.name] = value
    return found


POLICIES: dict[str, type[CachePolicy]] = _discovered()
