"""Policies `kvtier evaluate` compares the deployed ones against, which `recommend` never deploys:
libCacheSim's policies on the same block stream (`external.py`) and the learned next-use rows
with their LRU shadow and chosen readout (`nextuse_rows.py`)."""
