"""The latency wing: the one place kvtier turns a tier split into time to first token.

* ``models.py``: the :class:`~kvtier.policy.latency.models.LatencyModel` interface and its two
  registered models, the single-server queue (``queue``: :mod:`kvtier.policy.cost`) and the
  step-level engine model (``engine``: :mod:`kvtier.policy.engine_model`); how requests
  arrive in a replay (open or closed loop) is a property of the model.
* ``predict.py``: the one prediction function. Replays under the model's noise draws, then
  the statistic the engine measures (each percentile over the evaluated requests of the
  period), its point (the median over draws) and a 5th-95th percentile interval over draws
  crossed with resampled requests; the change between two tier configurations is paired on
  the same resampled requests.
* ``costfile.py``: the cost file's one reader and writer (``kvtier calibrate --out``, the
  demo), with where each cost came from and how many observations it rests on.
* ``choice.py``: which model a promise may use: the engine model when its held-out check
  held, else the queue model when its costs were measured, else no TTFT promise at all.

``recommend``, ``simulate``, the what-if, the demo, the held-out check and ``recommend
--check`` all call these; a recommendation records which model made its promise
(``Evidence.latency_model``).
"""
