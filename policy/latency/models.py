"""Latency models behind one interface: a tier split in, each request's TTFT out.

A model replays requests (:class:`~kvtier.policy.engine_model.step_replay.EngineRequests`:
arrivals, prompt and output tokens, the tokens each tier serves) and returns each request's
seconds to its first token under one draw of its noise (``rng``). How the requests arrive is
the model's own property, used alike by a promise and by the check of that promise:
``open`` (at their recorded times) or ``closed`` (each client's next request a recorded
think time after its last one ended: :mod:`kvtier.policy.engine_model.closed_loop`).

Registered (:data:`MODELS`, by name):

* ``queue``: one or more FIFO prefill servers, each request's service its promotions plus
  its recompute at a per-token rate (:class:`kvtier.policy.cost.CostParams`); open loop,
  deterministic (one draw is every draw).
* ``engine``: the step-level engine model (:mod:`kvtier.policy.engine_model`): batching,
  chunked prefill, decode steps sharing the GPU, promotions, the admission delay, each step
  with a draw of the fitted step noise.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np

from kvtier.collector.events import RequestRecord
from kvtier.policy.cost import CostParams, queue_ttft_samples
from kvtier.policy.engine_model.params import EngineModelParams
from kvtier.policy.engine_model.step_replay import EngineRequests

ARRIVALS = ("open", "closed")


class LatencyModel(Protocol):
    """What the prediction function needs of a model (see module doc)."""

    name: str

    @property
    def arrivals(self) -> str:
        """``open`` or ``closed``: how requests arrive in this model's replay."""

    @property
    def noisy(self) -> bool:
        """Whether two draws can differ (a model without noise is replayed once)."""

    def ttft_s(self, requests: EngineRequests, rng: np.random.Generator) -> np.ndarray:
        """Each request's TTFT in seconds, in the order given, under one draw of ``rng``."""


@dataclass(frozen=True)
class QueueModel:
    """``servers`` FIFO prefill servers priced by ``params`` (Lindley's recursion)."""

    params: CostParams
    servers: int = 1
    name: str = "queue"

    @property
    def arrivals(self) -> str:
        return "open"

    @property
    def noisy(self) -> bool:
        return False

    def service_s(self, requests: EngineRequests) -> np.ndarray:
        p = self.params
        return np.array([p.service_s(int(c), int(k), int(r)) for c, k, r in zip(
            requests.cpu_tokens, requests.cold_tokens, requests.recompute_tokens)], dtype=float)

    def ttft_s(self, requests: EngineRequests, rng: np.random.Generator) -> np.ndarray:
        order = np.argsort(requests.arrival_s, kind="stable")
        ttft = np.empty(len(requests))
        ttft[order] = queue_ttft_samples(requests.arrival_s[order], self.service_s(requests)[order],
                                         self.servers)
        return ttft


@dataclass(frozen=True)
class StepModel:
    """The step-level engine model with ``params``; its arrivals are ``params.arrivals``."""

    params: EngineModelParams
    name: str = "engine"

    @property
    def arrivals(self) -> str:
        return self.params.arrivals

    @property
    def noisy(self) -> bool:
        p = self.params
        return bool(p.step_noise_s or p.prefill_step_noise_s or p.prefill_noise_by_work or p.admission_delay_s
                    or p.step_cost_draws or p.model_error_log_sd)

    def ttft_s(self, requests: EngineRequests, rng: np.random.Generator) -> np.ndarray:
        run, factor = self.draw(requests, rng)
        return run.ttft_s * factor

    def draw(self, requests: EngineRequests, rng: np.random.Generator):
        """One draw: the replay (TTFT, ITL, end-to-end per request) and the factor its TTFTs
        take for the model's own held-out error (``EngineModelParams.model_error_log_sd``),
        drawn first so the replay's noise repeats."""
        sd = self.params.model_error_log_sd
        factor = float(np.exp(sd * rng.standard_normal())) if sd else 1.0
        return self.replay(requests, rng), factor

    def replay(self, requests: EngineRequests, rng: np.random.Generator):
        """The whole replay (TTFT, ITL, end-to-end per request), for the held-out check."""
        from kvtier.policy.engine_model.step_replay import replay

        return replay(requests, self.params, rng)


MODELS = {"queue": QueueModel, "engine": StepModel}


def requests_for(model: LatencyModel, records: Sequence[RequestRecord],
                 splits: Sequence | None = None) -> EngineRequests:
    """``records`` (in arrival order) as ``model`` replays them: with ``splits`` (one
    :class:`~kvtier.collector.request_tokens.RequestTokens` per request: the tier replay's)
    in place of the recorded split, and chained into client loops when the model's arrivals
    are closed."""
    from kvtier.policy.engine_model.closed_loop import client_chains

    requests = EngineRequests.from_records(records, splits)
    if model.arrivals == "closed" and len(records) > 1:
        follows, think = client_chains(records)
        requests = requests.closed_loop(follows, think)
    return requests


def scaled(requests: EngineRequests, time_scale: float) -> EngineRequests:
    """``requests`` with inter-arrival times scaled (a load ramp: 0.5 doubles the rate);
    think times of closed-loop clients are scaled alike."""
    think = None if requests.think_s is None else requests.think_s * time_scale
    return replace(requests, arrival_s=requests.arrival_s * time_scale, think_s=think)
