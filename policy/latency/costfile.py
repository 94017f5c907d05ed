"""The cost file: its one reader and its one writer.

``kvtier calibrate --out``, ``kvtier recommend`` (fitting a store itself) and the demo write
it; ``simulate``, ``evaluate`` and ``recommend`` read it (``--cost-params``). One JSON object:

* ``cost_params``: the single-server queue model's fitted parameters, by name
  (:class:`kvtier.policy.cost.CostParams` fields; what was not fitted keeps its default);
* ``kv_bytes_per_token``: the KV geometry the engine's block events carry (or ``null``);
* ``engine_model``: the step-level engine model's parameters
  (:class:`~kvtier.policy.engine_model.params.EngineModelParams`), when it could be fitted;
* ``held_out``: the engine model fitted on the earlier requests and checked on the later
  ones, per tier configuration (``check.py``), with the single-server model beside it;
* ``costs``: every cost with its source and the number of observations behind it
  (:class:`CostEvidence`), for the report and the dashboard.

Written as strict JSON: a value that is not a number (an unmeasured ratio) is ``null``.
A file written before ``costs`` existed still reads (with no evidence listed).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from kvtier.collector import json_text
from kvtier.policy.engine_model.params import SECTION, EngineModelParams


@dataclass(frozen=True)
class CostEvidence:
    """One cost, where it came from (``measured``, ``calibrated``, ``given``, ``default``) and
    how many observations it rests on (``None``: not counted, e.g. a default)."""

    name: str
    value: float
    source: str
    observations: int | None = None
    note: str = ""

    def to_dict(self) -> dict:
        return {"name": self.name, "value": self.value, "source": self.source,
                "observations": self.observations, "note": self.note}


@dataclass(frozen=True)
class CostFile:
    cost_params: dict = field(default_factory=dict)
    kv_bytes_per_token: int | None = None
    engine: EngineModelParams | None = None
    held_out: dict | None = None
    costs: tuple[CostEvidence, ...] = ()
    fits: dict = field(default_factory=dict)
    written_by: str = "kvtier calibrate"

    def promotion_measured(self) -> bool:
        """Whether these costs priced a CPU promotion from the engine's own records: steps
        that loaded promoted KV, or timed load jobs."""
        return any(c.source != "default" and (c.observations or 0) > 0 for c in self.costs
                   if c.name in ("step.loaded_byte_s", "cpu_gpu_bandwidth_bytes_per_s"))

    def to_json(self) -> str:
        # "probe": "calibrate" marks every parameter calibrated where a reader prices them
        body = {"probe": "calibrate", "written_by": self.written_by,
                "cost_params": dict(self.cost_params),
                "kv_bytes_per_token": self.kv_bytes_per_token, "fits": self.fits,
                "costs": [c.to_dict() for c in self.costs]}
        if self.engine is not None:
            body[SECTION] = self.engine.to_dict()
        if self.held_out is not None:
            body["held_out"] = self.held_out
        return json_text.dumps(body, indent=2) + "\n"  # strict: a NaN is null


def write_cost_file(path: str | Path, cost_file: CostFile) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(cost_file.to_json())
    return path


def read_cost_file(path: str | Path) -> CostFile:
    """The file at ``path``; ``ValueError`` naming what is wrong (``OSError`` if unreadable)."""
    body = json.loads(Path(path).read_text())
    if not isinstance(body, dict) or not isinstance(body.get("cost_params"), dict):
        raise ValueError("it has no cost_params object")
    engine = None
    if body.get(SECTION) is not None:
        try:
            engine = EngineModelParams.from_dict(body[SECTION])
        except ValueError as error:
            raise ValueError(f"{error}") from None
    held = body.get("held_out")
    per_token = body.get("kv_bytes_per_token")
    if per_token is not None and (isinstance(per_token, bool) or not isinstance(per_token, int)
                                  or per_token < 1):
        raise ValueError(f"kv_bytes_per_token must be an int >= 1 or null, got {per_token!r}")
    try:
        costs = tuple(CostEvidence(**c) for c in body.get("costs") or ())
    except TypeError as error:
        raise ValueError(f"costs: {error}") from None
    return CostFile(body["cost_params"], per_token, engine, held if isinstance(held, dict) else None,
                    costs, body.get("fits") or {}, str(body.get("written_by", body.get("probe", ""))))
