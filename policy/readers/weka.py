"""WEKA kv-cache-tester agentic-coding traces (Claude Code sessions): one JSON per conversation.

Accepted inputs: a ``.tar.gz``/``.tgz`` of ``*.json`` files, a folder of them, or one file.
Top level: ``id, models, block_size, hash_id_scope, tool_tokens, system_tokens, requests,
totals``. A request has ``t`` (s from its conversation's start), ``in``, ``out``, ``hash_ids``
and descriptive fields; a sub-agent entry (``type: "subagent"``) nests its own ``requests``
whose ``t`` counts from the sub-agent's own ``t``. Only full blocks are hashed:
``len(hash_ids) == in // block_size`` (64), so a prompt's partial tail is always prefilled.

**Request signals** (what a gateway knows of each request): ``stop`` becomes ``stop_reason``
(``tool_use``, ``end_turn``, ...) with ``finish_status`` ``stopped`` (``length`` for
``max_tokens``; none when the trace leaves ``stop`` empty), ``model`` the model, ``api_time``
(seconds the upstream API took) ``e2e_latency_s``, so the finish is ``arrival_s +
e2e_latency_s``. A sub-agent's requests have ``request_type`` ``subagent`` and
``parent_request_id`` naming the main request that started the agent.

**Ids.** ``hash_id_scope`` is ``"local"``: ids are per conversation and sub-agents share their
parent's namespace. An id becomes ``stable_namespace(conversation id) | local id`` (blake2b of
the conversation id in the high 32 bits), so equal local ids never collide across conversations
and the result is the same in every process.

**Layout in time** (the traces carry no absolute start): conversations start one after another
in archive (or sorted file name) order, conversation *k* at ``k * start_gap_s`` (default 60 s,
which keeps a few dozen median-length sessions overlapping, like one busy serving node).
A request arrives at its conversation's start plus its (nested) ``t``. Records stream in
arrival order while holding only conversations that can still emit earlier arrivals; with
``start_gap_s=0`` every conversation is held at once.
"""

from __future__ import annotations

import heapq
import tarfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kvtier.collector.events import RequestRecord
from kvtier.policy.readers.base import (
    BadLine,
    SkipCounter,
    TraceFormatError,
    check_fields,
    hash_array,
    json_loads,
    non_negative_int,
    non_negative_number,
    stable_namespace,
)

TOP_FIELDS = frozenset({"id", "requests", "block_size"})
TOP_OPTIONAL = frozenset({"models", "hash_id_scope", "tool_tokens", "system_tokens", "totals"})
REQUEST_FIELDS = frozenset({"t", "in", "out", "hash_ids"})
REQUEST_OPTIONAL = frozenset({"type", "model", "input_types", "output_types", "stop", "api_time",
                              "think_time", "ttft"})
SUBAGENT_FIELDS = frozenset({"t", "type", "requests"})
SUBAGENT_OPTIONAL = frozenset({"agent_id", "subagent_type", "duration_ms", "total_tokens",
                               "tool_use_count", "status", "models", "tool_tokens",
                               "system_tokens"})
LOCAL_ID_BITS = 32
DEFAULT_START_GAP_S = 60.0


@dataclass(frozen=True)
class WekaLayout:
    """How conversations are placed on one time axis (see the module docstring)."""

    start_gap_s: float = DEFAULT_START_GAP_S

    def __post_init__(self) -> None:
        if not self.start_gap_s >= 0:
            raise ValueError(f"start_gap_s must be >= 0, got {self.start_gap_s!r}")


class WekaReader(SkipCounter):
    """Reads WEKA conversations as one arrival-ordered stream of request records.

    A bad conversation file (invalid JSON, a bad request) raises :class:`TraceFormatError`
    naming the member and the request path, or with ``skip_bad`` is skipped whole and counted.
    """

    format_name = "weka"

    def __init__(self, path: str | Path, *, layout: WekaLayout = WekaLayout(),
                 skip_bad: bool = False) -> None:
        self.path = Path(path)
        self.layout = layout
        self.skip_bad = skip_bad
        self.skipped = 0

    def requests(self) -> Iterator[RequestRecord]:
        self.skipped = 0
        heap: list[tuple[float, int, RequestRecord]] = []
        sequence = 0
        for index, (name, raw) in enumerate(self._documents()):
            start_s = index * self.layout.start_gap_s
            while heap and heap[0][0] < start_s:  # later conversations all start at or after
                yield heapq.heappop(heap)[2]
            for record in self._conversation(name, raw, start_s):
                heapq.heappush(heap, (record.arrival_s, sequence, record))
                sequence += 1
        while heap:
            yield heapq.heappop(heap)[2]

    def _documents(self) -> Iterator[tuple[str, bytes]]:
        if self.path.is_dir():
            for file in sorted(self.path.glob("*.json")):
                yield f"{self.path}/{file.name}", file.read_bytes()
        elif self.path.name.endswith((".tar.gz", ".tgz", ".tar")):
            yield from self._tar_members()
        else:
            yield str(self.path), self.path.read_bytes()

    def _tar_members(self) -> Iterator[tuple[str, bytes]]:
        try:
            with tarfile.open(self.path) as archive:
                for member in archive:
                    if member.isfile() and member.name.endswith(".json"):
                        yield f"{self.path}:{member.name}", archive.extractfile(member).read()
        except (tarfile.TarError, EOFError, OSError) as error:
            raise TraceFormatError(self.path, None, f"unreadable archive ({error})") from error

    def _conversation(self, name: str, raw: bytes, start_s: float) -> list[RequestRecord]:
        try:
            doc = json_loads(raw)
            if not isinstance(doc, dict):
                raise BadLine("expected a JSON object per conversation")
            check_fields(doc, TOP_FIELDS, TOP_OPTIONAL)
            conv = _Conversation(str(doc["id"]), non_negative_int(doc, "block_size"))
            conv.walk(doc["requests"], start_s, "requests", kind="main")
            return conv.records
        except BadLine as error:
            self._bad(Path(name), None, str(error))
            return []


class _Conversation:
    """Flattens one conversation's (nested) requests into records."""

    def __init__(self, conversation_id: str, block_tokens: int) -> None:
        if block_tokens <= 0:
            raise BadLine(f"block_size must be > 0, got {block_tokens}")
        self.id = conversation_id
        self.block_tokens = block_tokens
        self.namespace = np.uint64(stable_namespace(conversation_id, LOCAL_ID_BITS))
        self.records: list[RequestRecord] = []
        self.last_main: str | None = None

    def walk(self, entries: Iterable, origin_s: float, where: str, kind: str,
             parent: str | None = None) -> None:
        if not isinstance(entries, list):
            raise BadLine(f"{where} must be a list")
        for i, entry in enumerate(entries):
            at = f"{where}[{i}]"
            if not isinstance(entry, dict):
                raise BadLine(f"{at} must be an object")
            if entry.get("type") == "subagent":
                start_s = origin_s + _prefixed(at, _subagent_t, entry)
                spawner = self.last_main if kind == "main" else parent
                self.walk(entry["requests"], start_s, f"{at}.requests", kind="subagent",
                          parent=spawner)
            else:
                record = _prefixed(at, self._record, entry, origin_s, kind, i, parent)
                self.records.append(record)
                if kind == "main":
                    self.last_main = record.request_id

    def _record(self, entry: dict, origin_s: float, kind: str, index: int,
                parent: str | None) -> RequestRecord:
        check_fields(entry, REQUEST_FIELDS, REQUEST_OPTIONAL)
        prompt = non_negative_int(entry, "in")
        local = hash_array(entry, "hash_ids", prompt // self.block_tokens,
                           f"in // {self.block_tokens}")
        if len(local) and int(local.max()) >= 1 << LOCAL_ID_BITS:
            raise BadLine(f"hash_ids holds {int(local.max())}; local ids must be < 2**{LOCAL_ID_BITS}")
        return RequestRecord(
            request_id=f"{self.id}:{len(self.records)}",
            arrival_s=origin_s + non_negative_number(entry, "t"),
            prompt_tokens=prompt, output_tokens=non_negative_int(entry, "out"),
            block_hashes=tuple((local | self.namespace).tolist()),
            block_size_tokens=self.block_tokens,
            session_id=self.id, request_type=kind, turn=index + 1,
            ttft_s=non_negative_number(entry, "ttft") if entry.get("ttft") is not None else None,
            parent_request_id=parent, model=_text(entry, "model"),
            e2e_latency_s=(non_negative_number(entry, "api_time")
                           if entry.get("api_time") is not None else None),
            **_finish(entry),
        )


STOP_LENGTH = "max_tokens"  # the Anthropic API's stop reason for a response cut at its limit


def _finish(entry: dict) -> dict:
    """``finish_status``/``stop_reason`` from ``stop`` (empty or absent: unknown)."""
    stop = _text(entry, "stop")
    if stop is None:
        return {}
    return {"stop_reason": stop, "finish_status": "length" if stop == STOP_LENGTH else "stopped"}


def _text(entry: dict, name: str) -> str | None:
    value = entry.get(name)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise BadLine(f"{name} must be a string, got {value!r}")
    return value


def _subagent_t(entry: dict) -> float:
    check_fields(entry, SUBAGENT_FIELDS, SUBAGENT_OPTIONAL)
    return non_negative_number(entry, "t")


def _prefixed(where: str, parse, *args):
    """Run a parser, prefixing any problem with the request's path in the document."""
    try:
        return parse(*args)
    except BadLine as error:
        raise BadLine(f"{where}: {error}") from None
