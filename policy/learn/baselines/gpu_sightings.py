"""``sightings-gpu``, a row of ``kvtier evaluate`` only: the sighting filter in front of the
GPU prefix cache as well as the CPU tier. A block a request computes afresh is kept in the GPU
only from its :data:`kvtier.policy.learn.pairs.GPU_SIGHTINGS`-th request on (the request
holds its slot while it runs; ``SimConfig.gpu_sightings``), so one-time blocks take no cached
slot in either tier; GPU victims, having passed the filter, go to the CPU tier's LRU. This is
the two-tier form of libCacheSim's LRU behind its Bloom filter (one cache of both tiers' size,
admitting a block on its second request), which a CPU-tier admission alone cannot reach where
the GPU tier is a large share of the stack. No engine has a setting for it; kvtier's vLLM
connector applies it (``kvtier_gpu_sightings``), and ``recommended`` considers it with its
pairs (:func:`kvtier.policy.learn.pairs.candidates`)."""

from __future__ import annotations

SIGHTINGS_GPU = "sightings-gpu"
