"""Live what-if curves: each serving instance's token hit ratio at a ladder of tier sizes,
kept by the collector at ingest (``live_curves.py``), and the tier-aware headroom signal
(``load_headroom.py``); their values and file (``curve_values.py``) are what ``recommend
--live-curves`` and the dashboard read."""
