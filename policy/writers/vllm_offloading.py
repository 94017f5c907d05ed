"""vLLM's offloading shorthand in a ``vllm serve --config`` file, and how a push takes it over.

vLLM's guide starts a CPU tier with ``--kv-offloading-size 16 --kv-offloading-backend
native`` (GiB, the total over the tensor-parallel ranks). vLLM 0.33 then overrides the
kv-transfer-config's connector and ``cpu_bytes_to_use`` with its own
(:func:`kvtier.policy.writers.vllm_shape.resolve`), so a push that wrote only the
kv-transfer-config would leave the engine on the old size, and on vLLM's connector instead of
the one written. A push therefore removes ``kv-offloading-size`` and
``kv-offloading-backend`` (``VLLM_USE_SIMPLE_KV_OFFLOAD`` then picks nothing) and writes the
CPU tier into the kv-transfer-config, which vLLM obeys as written:

* with no kv-transfer-config in the file, onto kvtier's recording connector and spec (vLLM's
  ``OffloadingConnector`` and CPU spec with kvtier's accounting; the engine's environment
  needs kvtier installed, as for any kvtier plug-in);
* with one, onto the connector it names, by the writer's usual rule (an offloading connector
  is kept; another product's only with ``force``).

The lmcache backend hands the cache to LMCache's own server (vLLM passes it no size): it is
taken over only with ``force`` (``kvtier push --engine lmcache`` edits LMCache's config). The
note says what vLLM ran before and what changed.
"""

from __future__ import annotations

import math

from kvtier.policy.writers.vllm_shape import (KVTIER_CONNECTORS, KVTIER_SPECS, OFFLOADING_BACKENDS,
                                              SIMPLE_SWITCH, Shorthand, resolve)
from kvtier.policy.writers.yamledit import ConfigFileError, YamlDoc

SIZE_KEY, BACKEND_KEY = "kv-offloading-size", "kv-offloading-backend"
((KVTIER_CONNECTOR_PATH, (KVTIER_CONNECTOR,)),) = KVTIER_CONNECTORS.items()
((KVTIER_SPEC_PATH, (KVTIER_CPU_SPEC, _)),) = KVTIER_SPECS.items()


def read(doc: YamlDoc) -> Shorthand:
    """The shorthand the file gives (vLLM reads a YAML value as it would the flag's text),
    with ``VLLM_USE_SIMPLE_KV_OFFLOAD`` from this environment; :class:`ConfigFileError` for
    a value vLLM would refuse."""
    size, backend = doc.get((SIZE_KEY,)), doc.get((BACKEND_KEY,))
    size_gib = None
    if size is not None:
        try:
            size_gib = float(size) if not isinstance(size, bool) else None
        except (TypeError, ValueError, OverflowError):
            pass
        if size_gib is None or not 0 <= size_gib < math.inf:
            raise ConfigFileError(f"{doc.spelling(SIZE_KEY)} must be a number of GiB >= 0 (vLLM's "
                                  f"--kv-offloading-size), got {size!r}")
    if backend is not None and backend not in OFFLOADING_BACKENDS:
        raise ConfigFileError(f"{doc.spelling(BACKEND_KEY)} {backend!r} is not one of vLLM's "
                              f"({', '.join(OFFLOADING_BACKENDS)})")
    return Shorthand.from_environment(size_gib, backend or "native")


def take_over(doc: YamlDoc, transfer: dict | None, shorthand: Shorthand,
              force: bool) -> tuple[dict, str]:
    """Remove the shorthand's keys from ``doc``; returns the kv-transfer-config to write the
    settings onto (kvtier's recording one where the file has none) and the note."""
    ran = resolve(transfer, shorthand)
    if shorthand.backend == "lmcache" and not force:
        raise ConfigFileError(
            f"{doc.spelling(SIZE_KEY)} with {doc.spelling(BACKEND_KEY)}: lmcache makes vLLM load "
            f"LMCache's {ran.connector}, whose size LMCache's server sets (kvtier push --engine "
            "lmcache edits its config); add --force to move this engine onto kvtier's connector")
    removed = doc.delete((SIZE_KEY, BACKEND_KEY))
    given = " and ".join(f"{key}: {value}" for key, value in zip(
        removed, (_size_text(shorthand.size_gib), shorthand.backend)))
    switch = (f", {SIMPLE_SWITCH}=1 as here" if shorthand.backend == "native" and shorthand.simple
              else "")
    onto = ("the connector kv-transfer-config names" if transfer is not None else
            f"kvtier's recording {KVTIER_CONNECTOR} (vLLM's OffloadingConnector with kvtier's "
            "accounting; the engine's environment needs kvtier installed)")
    note = (f"{given} removed: with {'it' if len(removed) == 1 else 'them'} vLLM overrides kv-transfer-config's connector and size "
            f"(it ran {ran.sentence()}{switch}); the CPU tier is now set in kv-transfer-config, "
            f"on {onto}")
    return (transfer if transfer is not None else recording_transfer()), note


def _size_text(size_gib: float | None) -> str:
    return f"{size_gib:g}" if size_gib is not None else "null"


def recording_transfer() -> dict:
    """A kv-transfer-config that loads kvtier's connector and its CPU offloading spec (the
    settings are written onto it)."""
    return {"kv_connector": KVTIER_CONNECTOR, "kv_connector_module_path": KVTIER_CONNECTOR_PATH,
            "kv_role": "kv_both",
            "kv_connector_extra_config": {"spec_name": KVTIER_CPU_SPEC,
                                          "spec_module_path": KVTIER_SPEC_PATH}}
