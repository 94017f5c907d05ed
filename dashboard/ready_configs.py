"""The engine configs the recommendation page offers to copy, rendered by the writers
``kvtier push`` uses, from the settings each engine receives.

vLLM's is rendered into a ``--kv-transfer-config`` that loads kvtier's recording connector and
spec (``kvtier.probes.vllm``), as a push into such a config writes it (a push keeps the
connector a file loads): copied by hand, the file goes on recording. The file ``kvtier
recommend`` writes, ``vllm.json``, names vLLM's own ``OffloadingConnector``, which serves the
same tiers and records no request. Every other engine's is what a push writes into a new file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from kvtier.dashboard.artifacts import CONFIG_LANGUAGES
from kvtier.policy.recommend.recommendation import Recommendation
from kvtier.policy.writers import WRITERS
from kvtier.policy.writers.vllm_shape import KVTIER_CONNECTORS, KVTIER_SPECS

@dataclass(frozen=True)
class ReadyConfig:
    """One engine's config to copy: ``name`` (the file ``kvtier recommend`` writes for it),
    ``language`` for highlighting, the ``text``, and the notes the writer gives with it."""

    engine: str
    name: str
    language: str
    text: str
    notes: tuple[str, ...] = ()


def recording_vllm_config() -> str:
    """A ``--kv-transfer-config`` that loads kvtier's connector and its CPU offloading spec."""
    ((connector_path, (connector,)),) = KVTIER_CONNECTORS.items()
    ((spec_path, (cpu_spec, _)),) = KVTIER_SPECS.items()
    return json.dumps({"kv_connector": connector, "kv_connector_module_path": connector_path,
                       "kv_role": "kv_both",
                       "kv_connector_extra_config": {"spec_module_path": spec_path,
                                                     "spec_name": cpu_spec}})


# the config each engine's copy is rendered into (absent: a new file)
RENDERED_INTO = {"vllm": recording_vllm_config()}


def ready_configs(rec: Recommendation) -> tuple[ReadyConfig, ...]:
    """Each engine of ``rec``'s config, in the recommendation's engine order; an engine whose
    writer refuses its settings is left out (the recommendation's notes say why)."""
    configs = []
    for engine, settings in rec.engine_settings:
        module = WRITERS.get(engine)
        if module is None:
            continue
        suffix = Path(module.DEFAULT_FILE).suffix
        try:
            rendered = module.render(settings, RENDERED_INTO.get(engine), suffix)
        except ValueError:
            continue
        configs.append(ReadyConfig(engine, module.DEFAULT_FILE, CONFIG_LANGUAGES.get(suffix, "text"),
                                   rendered.text, rendered.notes))
    return tuple(configs)
