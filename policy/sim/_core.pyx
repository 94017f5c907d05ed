# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The compiled replay core: tiers, policies, admitters and flows over dense block ids.

Pure: arrays of block ids per request in, totals, per-request outcomes and movement events
out. ``kvtier.policy.sim.simulator`` is its Python face; the pure-Python flows kept under tests/ are
the oracle it is compared against.
"""

from libc.math cimport INFINITY, exp, isfinite, log
from libc.stdint cimport int8_t, int32_t, int64_t, uint64_t
from libc.stdlib cimport calloc, free, malloc, qsort, realloc
from libc.string cimport memcpy, memset

import numpy as np

DEF NEVER = 9223372036854775807   # next use of a block that is not referenced again
NEVER_USED = NEVER

include "_buffers.pxi"
include "_ids.pxi"
include "_tier.pxi"
include "_policies.pxi"
include "_vllm_cpu.pxi"
include "_flow.pxi"
include "_admit.pxi"
include "_exclusive.pxi"
include "_vllm.pxi"
