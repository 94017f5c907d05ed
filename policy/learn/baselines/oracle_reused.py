"""``oracle-reused``, a row of ``kvtier evaluate`` only: the ceiling of a perfect reuse
predictor behind LRU (see :class:`ReusedLaterAdmitter`)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kvtier.collector.events import RequestRecord
from kvtier.policy.learn.replay import IndexedAdmitter
from kvtier.policy.sim.compiled import core
from kvtier.policy.sim.trace import BlockTrace

ORACLE_REUSED = "oracle-reused"


class ReusedLaterAdmitter(IndexedAdmitter):
    """A diagnostic, not a policy: admits an offer iff its block is referenced again later
    in the trace. It knows *whether* a block comes back, not *when*, so it bounds what a
    model answering "will this block be reused?" could reach with LRU eviction: how far a
    perfect reuse predictor, rather than a perfect eviction order, would close the gap."""

    name = ORACLE_REUSED

    def __init__(self, records: Sequence[RequestRecord], trace: BlockTrace | None = None
                 ) -> None:
        super().__init__({}, 0.5)
        trace = trace if trace is not None else BlockTrace.from_records(records)
        # each block and the last request that references it, sorted by block
        requests = np.repeat(np.arange(len(trace), dtype=np.int64), np.diff(trace.offsets))
        backwards = trace.hashes[::-1]
        self._blocks, first = np.unique(backwards, return_index=True)
        self._last_request = requests[::-1][first]

    def admits(self, key) -> bool:
        i = int(np.searchsorted(self._blocks, np.uint64(key)))
        found = i < len(self._blocks) and int(self._blocks[i]) == key
        return found and int(self._last_request[i]) > self.request_index

    def compiled_admitter(self, interner):
        """The compiled form: the last referencing request per block, by the flow's ids."""
        ids = interner.ids(self._blocks)
        last = np.full(len(interner), -1, dtype=np.int64)
        last[ids] = self._last_request
        return core().ReusedLater(last, self.chained)
