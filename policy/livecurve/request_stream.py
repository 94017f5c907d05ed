"""Requests as the live curves replay them, from the batches the collector stores.

A request's blocks are those its record carries (``block_hashes``: kvtier's vLLM hooks, the
reference engine, a trace's recorder); a record without them takes the lookup events (GPU hit,
CPU or cold promotion, recompute miss) its source sent for it, by position: the rule the
store's reader follows (:mod:`kvtier.collector.reader`), so the live curve and an offline
replay of the store see the same prompts. Records reach the collector as requests finish, so
each instance's requests wait in :class:`ArrivalOrder` until its newest arrival is
``reorder_s`` later, and are replayed in arrival order, as the replay of the store is.
Everything here is whole-column numpy work; only records without hashes cost Python per row.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kvtier.collector.batch import EventBatch
from kvtier.collector.block_kinds import LOOKUP_OUTCOMES

DEFAULT_BLOCK_TOKENS = 16  # a record without a block size, as the simulator assumes
SPLIT_FIELDS = ("gpu_hit_tokens", "cpu_promotion_tokens", "cold_promotion_tokens",
                "recomputed_tokens")
_LOOKUP_LABELS = pa.array(sorted(o.label for o in LOOKUP_OUTCOMES))
_MAX_WAITING_LOOKUPS = 50_000  # requests whose lookups wait for their record, per collector


@dataclass(frozen=True, eq=False)
class Requests:
    """Requests as arrays: request ``i``'s blocks are ``hashes[offsets[i]:offsets[i + 1]]``;
    ``split`` holds the tokens the engine measured per tier (GPU, CPU, cold, recomputed),
    -1 where the record does not say."""

    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    block_tokens: np.ndarray
    offsets: np.ndarray
    hashes: np.ndarray
    split: np.ndarray

    def __len__(self) -> int:
        return len(self.arrival_s)

    @classmethod
    def empty(cls) -> "Requests":
        return cls(np.zeros(0), np.zeros(0, np.int64), np.zeros(0, np.int64),
                   np.zeros(1, np.int64), np.zeros(0, np.uint64), np.zeros((0, 4), np.int64))

    def take(self, order: np.ndarray) -> "Requests":
        """The requests at ``order`` (indices), in that order."""
        lengths = np.diff(self.offsets)[order]
        offsets = np.zeros(len(order) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        starts = self.offsets[:-1][order]
        index = np.repeat(starts - offsets[:-1], lengths) + np.arange(offsets[-1])
        return Requests(self.arrival_s[order], self.prompt_tokens[order],
                        self.block_tokens[order], offsets, self.hashes[index], self.split[order])

    def part(self, start: int, stop: int) -> "Requests":
        """Requests ``start`` to ``stop`` as views (no copy)."""
        lo, hi = self.offsets[start], self.offsets[stop]
        return Requests(self.arrival_s[start:stop], self.prompt_tokens[start:stop],
                        self.block_tokens[start:stop], self.offsets[start:stop + 1] - lo,
                        self.hashes[lo:hi], self.split[start:stop])

    @staticmethod
    def concat(parts: list["Requests"]) -> "Requests":
        if len(parts) == 1:
            return parts[0]
        lengths = np.concatenate([np.diff(p.offsets) for p in parts])
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        return Requests(*(np.concatenate([getattr(p, name) for p in parts]) for name in
                          ("arrival_s", "prompt_tokens", "block_tokens")), offsets,
                        np.concatenate([p.hashes for p in parts]),
                        np.concatenate([p.split for p in parts]))


class LookupBuffer:
    """Lookup events waiting for a record without hashes, by (source, request id). A source
    whose records carry hashes is not buffered (its records say it all)."""

    def __init__(self, limit: int = _MAX_WAITING_LOOKUPS):
        self.limit = limit
        self.dropped = 0
        self._waiting: OrderedDict[tuple[str, str], np.ndarray] = OrderedDict()
        self._hashed_sources: set[str] = set()

    def add(self, batch: EventBatch) -> None:
        source, table = batch.origin.source, batch.block_events
        if source in self._hashed_sources or table.num_rows == 0:
            return
        lookups = table.filter(pc.and_(pc.is_in(pc.cast(table.column("kind"), pa.string()),
                                                _LOOKUP_LABELS),
                                       pc.is_valid(table.column("request_id"))))
        if lookups.num_rows == 0:
            return
        lookups = lookups.sort_by([("request_id", "ascending"), ("position", "ascending"),
                                   ("time_s", "ascending")])
        ids = np.asarray(lookups.column("request_id").to_numpy(zero_copy_only=False), dtype=object)
        hashes = lookups.column("block_hash").to_numpy().astype(np.uint64)
        starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
        for start, stop in zip(starts, np.r_[starts[1:], len(ids)]):
            key = (source, ids[start])
            before = self._waiting.pop(key, None)
            part = hashes[start:stop]
            self._waiting[key] = part if before is None else np.concatenate([before, part])
        while len(self._waiting) > self.limit:
            self._waiting.popitem(last=False)
            self.dropped += 1

    def hashed(self, source: str) -> None:
        """``source``'s records carry their hashes: stop keeping its lookups."""
        if source not in self._hashed_sources:
            self._hashed_sources.add(source)
            for key in [k for k in self._waiting if k[0] == source]:
                del self._waiting[key]

    def take(self, source: str, request_id: str) -> np.ndarray:
        return self._waiting.pop((source, request_id), np.zeros(0, np.uint64))


def requests_of(batch: EventBatch, lookups: LookupBuffer) -> Requests:
    """The requests ``batch`` records, in record order, with their blocks (see module doc)."""
    lookups.add(batch)
    table = batch.requests
    if table.num_rows == 0:
        return Requests.empty()
    listed = table.column("block_hashes")
    lengths = pc.fill_null(pc.list_value_length(listed), 0).to_numpy().astype(np.int64)
    hashes = pc.list_flatten(listed).to_numpy(zero_copy_only=False).astype(np.uint64, copy=False)
    if lengths.any():
        lookups.hashed(batch.origin.source)
    if not lengths.all():
        lengths, hashes = _with_lookups(table, lengths, hashes, batch.origin.source, lookups)
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    block_tokens = _ints(table.column("block_size_tokens"), DEFAULT_BLOCK_TOKENS)
    split = np.stack([_ints(table.column(name), -1) for name in SPLIT_FIELDS], axis=1)
    return Requests(_floats(table.column("arrival_s")), _ints(table.column("prompt_tokens"), 0),
                    np.where(block_tokens > 0, block_tokens, DEFAULT_BLOCK_TOKENS), offsets,
                    hashes, split)


def _with_lookups(table: pa.Table, lengths: np.ndarray, hashes: np.ndarray, source: str,
                  lookups: LookupBuffer) -> tuple[np.ndarray, np.ndarray]:
    ids = table.column("request_id").to_pylist()
    pieces, new_lengths, at = [], lengths.copy(), 0
    for i, length in enumerate(lengths.tolist()):
        if length:
            pieces.append(hashes[at:at + length])
            at += length
        else:
            found = lookups.take(source, ids[i])
            pieces.append(found)
            new_lengths[i] = len(found)
    return new_lengths, (np.concatenate(pieces) if pieces else hashes)


def _ints(column: pa.ChunkedArray, missing: int) -> np.ndarray:
    return pc.fill_null(column, missing).to_numpy().astype(np.int64)


def _floats(column: pa.ChunkedArray) -> np.ndarray:
    return pc.cast(column, pa.float64()).to_numpy(zero_copy_only=False).astype(np.float64)


class ArrivalOrder:
    """One instance's requests, held until ``reorder_s`` of later arrivals have come in (or
    the instance has been quiet that long on the collector's clock), then released in arrival
    order (stable: ties keep the order they came in)."""

    def __init__(self, reorder_s: float):
        self.reorder_s = reorder_s
        self._parts: list[Requests] = []
        self._newest_s = -np.inf
        self._oldest_s = np.inf
        self._last_added_s: float | None = None

    def __len__(self) -> int:
        return sum(len(p) for p in self._parts)

    def add(self, requests: Requests, now_s: float) -> None:
        if len(requests):
            self._parts.append(requests)
            self._newest_s = max(self._newest_s, float(requests.arrival_s.max()))
            self._oldest_s = min(self._oldest_s, float(requests.arrival_s.min()))
            self._last_added_s = now_s

    def release(self, now_s: float | None = None, *, everything: bool = False) -> Requests:
        """The requests due now, oldest arrival first (see the class doc)."""
        if not self._parts:
            return Requests.empty()
        quiet = (now_s is not None and self._last_added_s is not None
                 and now_s - self._last_added_s >= self.reorder_s)
        cut = np.inf if everything or quiet else self._newest_s - self.reorder_s
        if self._oldest_s > cut:
            return Requests.empty()
        held = Requests.concat(self._parts)
        if np.all(held.arrival_s[1:] >= held.arrival_s[:-1]):
            ordered = held  # already in arrival order (the common case): no copy
        else:
            ordered = held.take(np.argsort(held.arrival_s, kind="stable"))
        due = int(np.searchsorted(ordered.arrival_s, cut, side="right"))
        if due == len(ordered):
            self._parts, self._oldest_s = [], np.inf
            return ordered
        rest = ordered.part(due, len(ordered))
        self._parts = [rest]
        self._oldest_s = float(rest.arrival_s[0])
        return ordered.part(0, due)
