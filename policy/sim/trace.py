"""A trace as arrays: what the compiled replay reads, built once per trace.

Every request's block hashes back to back, where each request starts, and its prompt tokens,
block size and arrival; for learned policies the request signals the features read (turn,
sub-agent, session). No Python object per block: a trace of 80M block references is 0.7 GB
here where request records with tuples of ints take several GB.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from kvtier.collector.events import FINISH_CLASSES, RequestRecord, finish_class


@dataclass(frozen=True, eq=False)
class BlockTrace:
    """``hashes`` (uint64, all requests' blocks in order), ``offsets`` (int64, requests + 1:
    request ``i`` is ``hashes[offsets[i]:offsets[i + 1]]``), ``prompt_tokens``,
    ``block_tokens`` (int64 per request), ``arrival_s`` (float64); ``turns`` (int64, 0:
    unknown), ``subagent`` (int8, 1: a sub-agent call), ``sessions`` (int64 index of the
    session, -1: none), ``finish_classes`` (int8 index in ``FINISH_CLASSES`` of how it ended)
    and ``finish_s`` (float64: arrival plus its end-to-end latency, its arrival when the trace
    does not say), all per request."""

    hashes: np.ndarray
    offsets: np.ndarray
    prompt_tokens: np.ndarray
    block_tokens: np.ndarray
    arrival_s: np.ndarray
    turns: np.ndarray
    subagent: np.ndarray
    sessions: np.ndarray
    finish_classes: np.ndarray
    finish_s: np.ndarray

    def __post_init__(self) -> None:
        n = len(self.prompt_tokens)
        if len(self.offsets) != n + 1 or (n and self.offsets[-1] != len(self.hashes)):
            raise ValueError(f"offsets must have one entry per request plus one and end at the "
                             f"{len(self.hashes)} hashes, got {len(self.offsets)} entries")
        for name in ("block_tokens", "arrival_s", "turns", "subagent", "sessions",
                     "finish_classes", "finish_s"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"{name} must have one entry per request ({n}), got "
                                 f"{len(getattr(self, name))}")
        if n and self.block_tokens.min() <= 0:
            raise ValueError("block_tokens must be > 0 for every request")

    def __len__(self) -> int:
        return len(self.prompt_tokens)

    @property
    def block_refs(self) -> int:
        return len(self.hashes)

    def blocks(self, i: int) -> np.ndarray:
        """The hashes of request ``i``."""
        return self.hashes[self.offsets[i]:self.offsets[i + 1]]

    def requests(self, start: int, stop: int | None = None) -> BlockTrace:
        """Requests ``start`` to ``stop`` as a trace of their own."""
        stop = len(self) if stop is None else stop
        lo, hi = self.offsets[start], self.offsets[stop]
        return BlockTrace(self.hashes[lo:hi], self.offsets[start:stop + 1] - lo,
                          self.prompt_tokens[start:stop], self.block_tokens[start:stop],
                          self.arrival_s[start:stop], self.turns[start:stop],
                          self.subagent[start:stop], self.sessions[start:stop],
                          self.finish_classes[start:stop], self.finish_s[start:stop])

    @classmethod
    def from_records(cls, records: Sequence[RequestRecord] | Iterable[RequestRecord],
                     default_block_tokens: int | None = None) -> BlockTrace:
        """The arrays of ``records``. A record without a block size gets
        ``default_block_tokens`` (default: the first block size given, else 16)."""
        records = records if isinstance(records, Sequence) else list(records)
        if default_block_tokens is None:
            default_block_tokens = next((r.block_size_tokens for r in records
                                         if r.block_size_tokens), 16)
        lengths = np.fromiter((len(r.block_hashes) for r in records), dtype=np.int64,
                              count=len(records))
        offsets = np.zeros(len(records) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        hashes = np.fromiter(itertools.chain.from_iterable(r.block_hashes for r in records),
                             dtype=np.uint64, count=int(offsets[-1]))
        sessions: dict[str, int] = {}
        return cls(
            hashes, offsets,
            np.fromiter((r.prompt_tokens for r in records), dtype=np.int64, count=len(records)),
            np.fromiter((r.block_size_tokens or default_block_tokens for r in records),
                        dtype=np.int64, count=len(records)),
            np.fromiter((r.arrival_s for r in records), dtype=np.float64, count=len(records)),
            np.fromiter((r.turn or 0 for r in records), dtype=np.int64, count=len(records)),
            np.fromiter((r.request_type == "subagent" for r in records), dtype=np.int8,
                        count=len(records)),
            np.fromiter((-1 if r.session_id is None else
                         sessions.setdefault(r.session_id, len(sessions)) for r in records),
                        dtype=np.int64, count=len(records)),
            np.fromiter((FINISH_CLASSES.index(finish_class(r.finish_status, r.stop_reason))
                         for r in records), dtype=np.int8, count=len(records)),
            np.fromiter((r.arrival_s + (r.e2e_latency_s or 0.0) for r in records),
                        dtype=np.float64, count=len(records)))


def strip_blocks(records: Iterable[RequestRecord], default_block_tokens: int | None = None
                 ) -> tuple[tuple[RequestRecord, ...], BlockTrace]:
    """Read ``records`` once into a :class:`BlockTrace` and the same records without their
    block hashes (``block_hashes=()``: the trace holds them), so a large trace is in memory
    once, as arrays; each record's tuple of hashes is let go as soon as it is copied."""
    light: list[RequestRecord] = []
    pieces: list[np.ndarray] = []
    for record in records:
        pieces.append(np.array(record.block_hashes, dtype=np.uint64))
        light.append(dataclasses.replace(record, block_hashes=()))
    lengths = np.fromiter((len(p) for p in pieces), dtype=np.int64, count=len(pieces))
    offsets = np.zeros(len(pieces) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    hashes = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.uint64)
    del pieces
    meta = BlockTrace.from_records(light, default_block_tokens)
    return tuple(light), dataclasses.replace(meta, hashes=hashes, offsets=offsets)
