"""kvtier: observability and policy tuning for tiered KV caches in LLM serving.

One import namespace: this package is the command line and the demo that ties the parts
together, and the parts are its subpackages ``kvtier.collector``, ``kvtier.policy``,
``kvtier.probes``, ``kvtier.dashboard`` and ``kvtier.refengine``. The repository keeps them in
top-level folders beside this one; an installed kvtier has them inside this package (the build
maps each folder, see setup.py). In a checkout (``PYTHONPATH=.``, or an editable install) the
folder above is on this package's path, so the same names resolve to the same files.
"""

from pathlib import Path as _Path

__version__ = "0.1.0"


def _checkout_root() -> str | None:
    """The repository folder when this package runs from a checkout, else ``None``."""
    root = _Path(__file__).resolve().parent.parent
    if (root / "pyproject.toml").is_file() and (root / "collector" / "events.py").is_file():
        return str(root)
    return None


if (_root := _checkout_root()) is not None and _root not in __path__:
    __path__.append(_root)
