"""TensorRT-LLM KV-cache events -> kvtier block events, and a poller for ``/kv_cache_events``.

Formats covered: the JSON of
``tensorrt_llm/_utils.py::KVCacheEventSerializer`` (commit ``ed53795``) as returned by
``trtllm-serve``'s ``POST /kv_cache_events`` (a destructive drain) or by
``LLM.get_kv_cache_events()``, plus the newer envelope keys (``hash_algo``,
``layer_group_id``), per-block ``mm_keys``/``cache_salt`` and hex-string hashes
(``v2_sha256``). Unknown keys are ignored.

Mapping (TRT-LLM has two cache levels: 0 = GPU, 1 = host):

* ``created`` -> no rows; its ``num_blocks_per_cache_level`` is kept as capacity.
* ``stored`` -> ``STORE`` per block into the block's level, with its priority and token count.
* ``updated`` with ``cache_level`` 0->1 -> ``STORE`` GPU->CPU (offload to host);
  1->0 -> ``CPU_PROMOTION`` (onboard); a ``priority`` diff -> ``PRIORITY_UPDATE``.
* ``removed`` -> ``EVICT`` from the level the block was last seen at (GPU if never seen).

Events carry no timestamp, so rows get the poll time.
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

from kvtier.collector.batch import EventBatch
from kvtier.collector.events import (
    PRIORITY_MAX, PRIORITY_MIN, UINT64_MAX, BlockEvent, Origin, Outcome, Tier,
)
from kvtier.probes.polling import DEFAULT_HOST, FetchError, fetch

log = logging.getLogger(__name__)

_LEVEL_TIER = {0: Tier.GPU, 1: Tier.CPU}


class EventError(ValueError):
    """One TRT-LLM event that does not follow the documented shape; ``reason`` is the short
    label it is counted under (the message adds the value)."""

    def __init__(self, message: str, reason: str = "malformed event"):
        super().__init__(message)
        self.reason = reason


def to_block_hash(value) -> int:
    """An int (``v1_block_key``, ``v2_sha256_64``) or a hex string (``v2_sha256``) -> uint64."""
    if isinstance(value, bool):
        raise EventError("block hash cannot be a boolean")
    if isinstance(value, int):  # TRT-LLM's keys are unsigned: a negative one is corrupt
        if not 0 <= value <= UINT64_MAX:
            raise EventError(f"block hash {value} is outside 0..2**64-1", "block hash out of range")
        return value
    if isinstance(value, str) and value and not value.lstrip().startswith(("-", "+")):
        try:  # the low 64 bits of the digest, as block_hash_from_bytes folds bytes
            return int(value, 16) & UINT64_MAX
        except ValueError:
            raise EventError(f"block hash {value[:20]!r} is not hex") from None
    raise EventError(f"block hash must be an int or hex string, got {type(value).__name__}")


@dataclass
class TrtllmEventMapper:
    """Stateful mapping: it remembers each block's cache level so ``removed`` names a tier.

    One mapper per engine instance. ``capacity_blocks`` holds the last ``created`` event's
    blocks per level; ``bad_events`` counts events skipped as malformed, ``rejected`` the
    same by reason (the first few are logged).
    """

    max_tracked_blocks: int = 1_000_000
    capacity_blocks: tuple[int, ...] = ()
    bad_events: int = 0
    rejected: Counter = field(default_factory=Counter)
    _levels: dict = field(default_factory=dict)

    def map_events(self, events, time_s: float) -> list[BlockEvent]:
        """Map a list of TRT-LLM event dicts; malformed ones are counted and skipped (an
        event maps whole or not at all)."""
        if not isinstance(events, list):
            self._reject("body is not a list of events", type(events).__name__)
            return []
        out: list[BlockEvent] = []
        for event in events:
            try:
                out.extend(self._map_one(event, time_s))
            except EventError as error:
                self._reject(error.reason, error)
            except KeyError as error:
                self._reject(f"missing key {error}", event)
            except (ValueError, TypeError, AttributeError) as error:
                self._reject("malformed event", error)
        return out

    def _reject(self, reason: str, example) -> None:
        self.bad_events += 1
        self.rejected[reason] += 1
        if self.rejected[reason] <= 3:
            log.warning("TRT-LLM event skipped: %s (%s); %d so far", reason, str(example)[:200],
                        self.rejected[reason])

    def _map_one(self, event, time_s: float) -> list[BlockEvent]:
        data = event["data"]
        kind = data["type"]
        if kind == "created":
            self.capacity_blocks = tuple(int(n) for n in data["num_blocks_per_cache_level"])
            return []
        if kind == "stored":
            return self._stored(data, time_s)
        if kind == "removed":
            return [self._removed(h, time_s) for h in _list(data["block_hashes"])]
        if kind == "updated":
            return self._updated(data, time_s)
        raise EventError(f"unknown event type {kind!r}")

    def _stored(self, data: dict, time_s: float) -> list[BlockEvent]:
        parent = data.get("parent_hash")
        parent = None if parent is None else to_block_hash(parent)
        out = []
        for block in _list(data["blocks"]):
            block_hash = to_block_hash(block["block_hash"])
            level = _level(block.get("cache_level", 0))
            tokens = block.get("tokens")
            if tokens is not None and not isinstance(tokens, list):
                raise EventError(f"a stored block's tokens must be a list, got {tokens!r:.40}",
                                 "block tokens not a list")
            out.append(BlockEvent(time_s, Outcome.STORE, block_hash, parent_hash=parent,
                                  tokens=None if tokens is None else len(tokens),
                                  tier_to=_LEVEL_TIER[level],
                                  priority=_priority(block.get("priority"))))
            self._remember(block_hash, level)
            parent = block_hash
        return out

    def _removed(self, raw_hash, time_s: float) -> BlockEvent:
        block_hash = to_block_hash(raw_hash)
        level = self._levels.pop(block_hash, 0)
        return BlockEvent(time_s, Outcome.EVICT, block_hash, tier_from=_LEVEL_TIER[level])

    def _updated(self, data: dict, time_s: float) -> list[BlockEvent]:
        block_hash = to_block_hash(data["block_hash"])
        out = []
        level_diff = data.get("cache_level")
        if level_diff is not None:
            old, new = _level(level_diff["old_value"]), _level(level_diff["new_value"])
            if (old, new) == (0, 1):
                out.append(BlockEvent(time_s, Outcome.STORE, block_hash,
                                      tier_from=Tier.GPU, tier_to=Tier.CPU))
            elif (old, new) == (1, 0):
                out.append(BlockEvent(time_s, Outcome.CPU_PROMOTION, block_hash,
                                      tier_from=Tier.CPU, tier_to=Tier.GPU))
            self._remember(block_hash, new)
        priority_diff = data.get("priority")
        if priority_diff is not None:
            out.append(BlockEvent(time_s, Outcome.PRIORITY_UPDATE, block_hash,
                                  priority=_priority(priority_diff["new_value"])))
        return out

    def _remember(self, block_hash: int, level: int) -> None:
        if block_hash in self._levels or len(self._levels) < self.max_tracked_blocks:
            self._levels[block_hash] = level


def _list(value) -> list:
    if not isinstance(value, list):
        raise EventError(f"expected a list, got {type(value).__name__}")
    return value


def _level(value) -> int:
    if value not in _LEVEL_TIER or isinstance(value, bool):
        raise EventError(f"cache_level must be 0 (GPU) or 1 (host), got {value!r}")
    return value


def _priority(value) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not (
            PRIORITY_MIN <= value <= PRIORITY_MAX):
        raise EventError(f"priority must be an int in {PRIORITY_MIN}..{PRIORITY_MAX}, got {value!r}")
    return value


@dataclass(frozen=True)
class TrtllmPollerConfig:
    """``url`` is trtllm-serve's drain endpoint (loopback by default)."""

    url: str = f"{DEFAULT_HOST}:8000/kv_cache_events"
    instance: str = "trtllm"
    interval_s: float = 1.0
    timeout_s: float = 5.0

    def __post_init__(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise ValueError(f"url must be http(s), got {self.url!r}")
        for name in ("interval_s", "timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")
        if not self.instance:
            raise ValueError("instance must be a non-empty string")


@dataclass
class PollStats:
    polls: int = 0
    batches: int = 0
    block_events: int = 0
    fetch_errors: int = 0
    bad_bodies: int = 0
    bad_events: int = 0
    callback_errors: int = 0


class TrtllmEventPoller:
    """POST ``/kv_cache_events`` each round; hand the mapped events to ``on_batch``.

    Each non-empty round is one batch, numbered from 0 under a source named at construction
    (the drain is destructive, so there is nothing to replay). A round in flight when the
    service stops is finished and stored: the engine has let go of those events.
    """

    def __init__(self, config: TrtllmPollerConfig, on_batch: Callable[[EventBatch], None], *,
                 clock: Callable[[], float] = time.time):
        self.config, self._on_batch, self._clock = config, on_batch, clock
        self.mapper = TrtllmEventMapper()
        self.stats = PollStats()
        self._origin = Origin("trtllm", config.instance,
                              f"trtllm-http:{config.instance}:{int(clock() * 1000)}")
        self._sequence = 0

    @property
    def name(self) -> str:
        return self.config.url

    @property
    def poll_every_s(self) -> float:
        return self.config.interval_s

    def open(self) -> None:
        """Nothing to bind: each poll is one HTTP request."""

    def close(self) -> None:
        pass

    def poll(self, timeout_s: float = 0.0) -> int:
        """One drain; returns the number of block events delivered. A bad body is counted and
        skipped; an engine that cannot be reached or answers an error raises
        :class:`kvtier.probes.polling.FetchError` (an ``OSError``), for the service to retry."""
        return self._take(self.config.timeout_s)

    def drain(self, timeout_s: float) -> int:
        """At stop: one last drain of what the engine holds, if ``timeout_s`` allows. Nothing
        waits in the poller itself, so nothing is left unread (returns 0)."""
        if timeout_s > 0:
            try:
                self._take(min(self.config.timeout_s, timeout_s))
            except FetchError as error:
                log.info("TRT-LLM event poller: the last drain of %s at stop failed: %s",
                         self.config.url, error)
        return 0

    def _take(self, timeout_s: float) -> int:
        self.stats.polls += 1
        try:
            body = fetch(self.config.url, method="POST", timeout_s=timeout_s)
        except FetchError:
            self.stats.fetch_errors += 1
            raise
        try:
            events = json.loads(body)
        except ValueError:
            self.stats.bad_bodies += 1
            return 0
        return self.deliver(events)

    def deliver(self, events) -> int:
        """Map and hand over events obtained elsewhere (e.g. ``LLM.get_kv_cache_events()``)."""
        rows = self.mapper.map_events(events, self._clock())
        self.stats.bad_events = self.mapper.bad_events
        if not rows:
            return 0
        batch = EventBatch.from_rows(self._origin, self._sequence, block_events=rows)
        self._sequence += 1
        self.stats.batches += 1
        self.stats.block_events += batch.block_events.num_rows
        try:
            self._on_batch(batch)
        except Exception:
            self.stats.callback_errors += 1
            log.exception("TRT-LLM event poller: on_batch failed")
        return batch.block_events.num_rows
