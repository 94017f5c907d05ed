"""Which requests a learned policy trains on and which it is evaluated on: :class:`Split`."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from kvtier.collector.events import RequestRecord
from kvtier.policy.sim.trace import BlockTrace


@dataclass(frozen=True)
class Split:
    """Which records train and which are evaluated. ``records`` are replayed in full and
    counted from ``count_from``; ``train`` are the training records (a prefix of ``records``
    when ``count_from`` > 0, else a separate trace)."""

    records: tuple[RequestRecord, ...]
    train: tuple[RequestRecord, ...]
    count_from: int
    trace: BlockTrace | None = None        # the blocks of ``records``, as arrays
    train_trace: BlockTrace | None = None  # the blocks of ``train``

    def with_traces(self, trace: BlockTrace, train_trace: BlockTrace | None = None) -> Split:
        """This split with its records' blocks as arrays (records may then carry none:
        see :func:`kvtier.policy.sim.trace.strip_blocks`). A training prefix shares ``trace``."""
        if train_trace is None and self.count_from > 0:
            train_trace = trace.requests(0, self.count_from)
        return dataclasses.replace(self, trace=trace, train_trace=train_trace)

    @classmethod
    def by_time(cls, records: Sequence[RequestRecord], train_fraction: float) -> Split:
        """Train on the requests arriving in the first ``train_fraction`` of the time span."""
        if not 0 < train_fraction < 1:
            raise ValueError(f"train_fraction must be in (0, 1), got {train_fraction!r}")
        records = tuple(records)
        if len(records) < 4:
            raise ValueError(f"need at least 4 requests to split by time, got {len(records)}")
        start, end = records[0].arrival_s, records[-1].arrival_s
        cut = start + train_fraction * (end - start)
        index = next((i for i, r in enumerate(records) if r.arrival_s >= cut), len(records))
        index = min(max(index, 2), len(records) - 1)
        return cls(records, records[:index], index)

    @classmethod
    def by_count(cls, records: Sequence[RequestRecord], train_fraction: float) -> Split:
        """Train on the first ``train_fraction`` of the requests in arrival order (still
        earlier time: for traces whose span is a long thin tail, like WEKA's last sessions,
        a time split would leave a handful of requests to evaluate)."""
        if not 0 < train_fraction < 1:
            raise ValueError(f"train_fraction must be in (0, 1), got {train_fraction!r}")
        records = tuple(records)
        if len(records) < 4:
            raise ValueError(f"need at least 4 requests to split, got {len(records)}")
        index = min(max(int(len(records) * train_fraction), 2), len(records) - 1)
        return cls(records, records[:index], index)

    @classmethod
    def separate(cls, records: Sequence[RequestRecord], train: Sequence[RequestRecord]
                 ) -> Split:
        return cls(tuple(records), tuple(train), 0)
