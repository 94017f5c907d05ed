"""Where a recommendation's inputs came from: each cost parameter, the KV geometry and the
GPU tier's capacity as an :class:`InputSource`, so the report names every default it rests on."""

from __future__ import annotations

from kvtier.policy.cost import CostParams, Param
from kvtier.policy.recommend.values import InputSource


def input_sources(params: CostParams, gpu_blocks: int, block_tokens: int,
                  gpu_source: str = "given", gpu_note: str | None = None
                  ) -> tuple[InputSource, ...]:
    """The geometry first, then the GPU capacity (``gpu_note``: how it was measured), then
    every cost parameter that is set."""
    model = params.model
    rows = [InputSource("kv_bytes_per_token", float(model.bytes_per_token), model.source,
                        model.name),
            InputSource("gpu_tokens", float(gpu_blocks * block_tokens), gpu_source,
                        gpu_note or ("--gpu-tokens" if gpu_source == "given" else
                                     "not recorded: give --gpu-tokens, or scrape the "
                                     "engine's /metrics into the store (kvtier collect --scrape)"))]
    for name in params.__dataclass_fields__:
        value = getattr(params, name)
        if isinstance(value, Param):
            rows.append(InputSource(name, value.value, value.source, value.note))
    return tuple(rows)


def words(sources: tuple[InputSource, ...]) -> list[str]:
    """One line per source kind: what was measured, calibrated, given, and the defaults."""
    lines = []
    for kind in ("measured", "calibrated", "given", "default"):
        names = [f"{s.name} {s.value:,.6g}" for s in sources if s.source == kind]
        if names:
            lines.append(f"{kind}: {', '.join(names)}")
    return lines
