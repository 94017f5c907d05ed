"""Policies `kvtier evaluate` compares the deployed ones against, which `recommend` never deploys:
libCacheSim's LRU, alone and behind its Bloom-filter admission, on the same block stream
(`external.py`), the learned next-use rows with their LRU shadow and chosen readout
(`nextuse_rows.py`), retention's score as a CPU tier (`retention_tier.py`) and the ceiling of a
perfect reuse predictor (`oracle_reused.py`)."""
