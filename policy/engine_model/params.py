"""The engine model's parameters as one value, and their JSON section.

``kvtier calibrate --out`` writes them under ``"engine_model"`` beside the single-server
model's ``"cost_params"`` in one file (``kvtier simulate|evaluate|recommend --cost-params``
read both); a file without the section (written before it existed) still reads, as the
single-server parameters alone.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from kvtier.policy.engine_model.batch_scheduler import SchedulerLimits
from kvtier.policy.engine_model.step_cost import StepCost
from kvtier.policy.engine_model.transfers import TransferLink

SECTION = "engine_model"
VERSION = 1
FITTED_FROM = ("step_records", "request_search", "given")
ARRIVALS = ("open", "closed")


@dataclass(frozen=True)
class EngineModelParams:
    """Step cost, batching limits, the two promotion links and the KV bytes per token;
    ``fitted_from`` says how the step cost was found (one of :data:`FITTED_FROM`).

    ``step_noise_s``: quantiles (evenly spaced, 0th to 100th) of a step's measured duration
    less the step cost's, in seconds; the replay adds a draw from them to each step (a
    loaded host's slow steps). Empty: every step costs exactly the step cost.
    ``prefill_step_noise_s``: the same for the steps that prefill, when measured apart (their
    spread is several times a decode step's); empty: they draw from ``step_noise_s`` too.
    ``prefill_noise_by_work``: the prefill steps' noise apart by the work the step cost
    predicts for them, as ``(work_up_to_s, noise_s)`` pairs in increasing work (``noise_s``
    quantiles as above); a prefill step draws from the first range its work falls in (the
    last beyond it). Empty: every prefill step draws from ``prefill_step_noise_s``.
    ``admission_delay_s``: quantiles of the seconds from a request's arrival until the engine
    can schedule it (a frontend's tokenising and hand-off, a scheduler's pickup); the replay
    draws one per request. Empty: a request can be scheduled on arrival.
    ``arrivals``: how the engine's traffic arrived where the model was fitted, and so how a
    prediction replays requests: ``open`` (at their recorded times) or ``closed`` (clients
    that send the next request when the last ends: ``closed_loop.py``); a promise and its
    check replay alike.
    ``step_cost_draws``: the step cost refitted on resampled steps (``fit.resampled_step_costs``);
    each replay under a noise draw takes one of them, so the prediction's interval carries
    how uncertain the fit is. Empty: every replay uses ``step_cost``.
    ``model_error_log_sd``: how far the model itself missed when it was checked on requests it
    was not fitted on, as the standard deviation of log(predicted/measured) over the TTFT
    percentiles (``kvtier.policy.latency.check.model_error_log_sd``); each replay under a
    noise draw scales its TTFTs by a draw of exp(N(0, sd)), so a promise's interval holds the
    model's own error, not only the host's noise and the traffic's spread. 0: not known."""

    step_cost: StepCost = field(default_factory=StepCost)
    limits: SchedulerLimits = field(default_factory=SchedulerLimits)
    cpu_link: TransferLink = TransferLink(20e9, 20e-6)
    cold_link: TransferLink = TransferLink(2e9, 200e-6)
    kv_bytes_per_token: int = 131072
    fitted_from: str = "given"
    step_noise_s: tuple[float, ...] = ()
    prefill_step_noise_s: tuple[float, ...] = ()
    admission_delay_s: tuple[float, ...] = ()
    arrivals: str = "open"
    step_cost_draws: tuple[StepCost, ...] = ()
    model_error_log_sd: float = 0.0
    prefill_noise_by_work: tuple[tuple[float, tuple[float, ...]], ...] = ()

    def __post_init__(self) -> None:
        if self.fitted_from not in FITTED_FROM:
            raise ValueError(f"fitted_from must be one of {', '.join(FITTED_FROM)}, "
                             f"got {self.fitted_from!r}")
        if not (isinstance(self.model_error_log_sd, (int, float)) and 0 <= self.model_error_log_sd < 10):
            raise ValueError(f"model_error_log_sd must be in [0, 10), got {self.model_error_log_sd!r}")
        if self.arrivals not in ARRIVALS:
            raise ValueError(f"arrivals must be one of {', '.join(ARRIVALS)}, got {self.arrivals!r}")
        if isinstance(self.kv_bytes_per_token, bool) or not isinstance(self.kv_bytes_per_token, int) \
                or self.kv_bytes_per_token < 1:
            raise ValueError(f"kv_bytes_per_token must be an int >= 1, got {self.kv_bytes_per_token!r}")
        for name in ("step_noise_s", "prefill_step_noise_s", "admission_delay_s"):
            noise = getattr(self, name)
            if len(noise) == 1 or list(noise) != sorted(noise):
                raise ValueError(f"{name} must be empty or >= 2 non-decreasing seconds, got {noise!r}")
        edges = [work for work, _ in self.prefill_noise_by_work]
        if edges != sorted(edges) or any(len(noise) < 2 or list(noise) != sorted(noise)
                                         for _, noise in self.prefill_noise_by_work):
            raise ValueError("prefill_noise_by_work must be (work_up_to_s, >= 2 non-decreasing "
                             f"seconds) pairs in increasing work, got {self.prefill_noise_by_work!r}")

    def to_dict(self) -> dict:
        return {"version": VERSION, "fitted_from": self.fitted_from,
                "step_cost": self.step_cost.to_dict(), "limits": self.limits.to_dict(),
                "cpu_link": self.cpu_link.to_dict(), "cold_link": self.cold_link.to_dict(),
                "kv_bytes_per_token": self.kv_bytes_per_token, "step_noise_s": list(self.step_noise_s),
                "prefill_step_noise_s": list(self.prefill_step_noise_s),
                "admission_delay_s": list(self.admission_delay_s), "arrivals": self.arrivals,
                "step_cost_draws": [c.to_dict() for c in self.step_cost_draws],
                "model_error_log_sd": self.model_error_log_sd,
                "prefill_noise_by_work": [{"work_up_to_s": work, "noise_s": list(noise)}
                                          for work, noise in self.prefill_noise_by_work]}

    @classmethod
    def from_dict(cls, body: dict) -> EngineModelParams:
        version = body.get("version")
        if version != VERSION:
            raise ValueError(f"engine_model version {version!r} is not supported (this kvtier "
                             f"reads version {VERSION}); run kvtier calibrate again")
        try:
            return cls(StepCost(**body["step_cost"]), SchedulerLimits(**body["limits"]),
                       TransferLink(**body["cpu_link"]), TransferLink(**body["cold_link"]),
                       int(body["kv_bytes_per_token"]), body["fitted_from"],
                       tuple(float(v) for v in body.get("step_noise_s", ())),
                       tuple(float(v) for v in body.get("prefill_step_noise_s", ())),
                       tuple(float(v) for v in body.get("admission_delay_s", ())),
                       str(body.get("arrivals", "open")),
                       tuple(StepCost(**c) for c in body.get("step_cost_draws", ())),
                       float(body.get("model_error_log_sd", 0.0)),
                       tuple((float(r["work_up_to_s"]), tuple(float(v) for v in r["noise_s"]))
                             for r in body.get("prefill_noise_by_work", ())))
        except (KeyError, TypeError) as error:
            raise ValueError(f"engine_model section is malformed: {error}") from None


def read_engine_params(path: str | Path) -> EngineModelParams | None:
    """The engine model's parameters in a ``--cost-params`` file; ``None`` when the file
    has no ``engine_model`` section. ``ValueError`` names a malformed one."""
    body = json.loads(Path(path).read_text())
    section = body.get(SECTION) if isinstance(body, dict) else None
    if section is None:
        return None
    try:
        return EngineModelParams.from_dict(section)
    except ValueError as error:
        raise ValueError(f"{path}: {error}") from None
