"""A step-level engine model: requests through promotion transfer queues and a batch
scheduler into costed steps; TTFT, ITL and end-to-end latency per request.

One concept per file: ``step_cost.py`` (what a step costs), ``batch_scheduler.py`` (which work a
step does), ``transfers.py`` (promotions over bandwidth-limited links), ``step_replay.py`` (the
run), ``params.py`` (the parameters and their JSON section), ``fit.py`` (fitting them to
step records or request records). Predictions and the held-out check against an engine
go through the latency wing (:mod:`kvtier.policy.latency`).
It runs after the tier replay, per request and per step, never per block.
"""
