# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The learned models' compiled kernels, run inside the replay core's flows: the feature
tracker and the offer log (``_features``, ``_learned``), learned retention (``_learned``), the
forest that scores feature rows (``_forest``), the learned next-use order with its request
signals and gap tables (``_nextuse``, ``_nextuse_order``) and the shadowed tier that carries its
own baseline (``_shadow``).

They plug into the core (``kvtier.policy.sim._core``) through its declared protocol
(``policy/sim/_core.pxd``): tiers subclass ``Tier``, the trackers are ``Observer``s, the offer log
is the exclusive flow's ``OfferObserver``. The Python faces in ``kvtier.policy.learn`` build them;
the per-key versions under tests/ are the oracles they are checked against, bit for bit.
"""

from libc.math cimport INFINITY, exp, isfinite, log
from libc.stdint cimport int8_t, int32_t, int64_t, uint64_t
from libc.stdlib cimport calloc, free, malloc, realloc
from libc.string cimport memset

import numpy as np

from kvtier.policy.sim._core cimport (
    NONE, Admitter, Buf, Flow, Info, Interner, Lists, Observer, OfferObserver, ScoreTable, Tier,
    buf_free, buf_push, grow_f64, grow_i8, grow_i64, grow_ids, grown, id_t)

include "_features.pxi"
include "_learned.pxi"
include "_forest.pxi"
include "_nextuse.pxi"
include "_shadow.pxi"
