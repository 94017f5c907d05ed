"""Probe results -> the cost model's parameters (``policy.cost.CostParams``), marked measured.

``transfer`` gives the CPU<->GPU pair, ``fs`` the cold->CPU pair; parameters no probe measured
keep the model's documented defaults. Accepts result objects or their JSON (``--out`` files).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path


def measured_cost_params(*results, base=None):
    """``CostParams`` with every parameter a result's ``cost_params`` names set as measured.

    ``results`` are probe results (with ``cost_params()``), their ``to_dict()`` bodies, or
    paths to JSON files written by ``kvtier probe ... --out``.
    """
    from policy.cost import CostParams, Param

    params = base or CostParams()
    for result in results:
        body = _body(result)
        for name, value in (body.get("cost_params") or {}).items():
            if not hasattr(params, name):
                raise ValueError(f"unknown cost parameter {name!r} in {body.get('probe')} result")
            note = f"measured by kvtier probe {body.get('probe')}"
            params = replace(params, **{name: Param(float(value), "measured", note)})
    return params


def _body(result) -> dict:
    if isinstance(result, (str, Path)):
        return json.loads(Path(result).read_text())
    if isinstance(result, dict):
        return result
    return result.to_dict()
