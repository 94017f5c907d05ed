"""A minimal OpenAI-compatible streaming client that times each token (standard library only).

Times are taken when the client reads the bytes: TTFT from sending the request to the first
token's chunk, inter-token latency between chunks, end-to-end to the ``[DONE]`` marker.
"""

from __future__ import annotations

import http.client
import json
import time
from dataclasses import dataclass, field
from typing import Callable
from urllib.parse import urlsplit


@dataclass
class Completion:
    """One timed request. ``error`` is set (and timings may be missing) when it failed."""

    sent_s: float
    token_times_s: list[float] = field(default_factory=list)
    done_s: float | None = None
    output_tokens: int = 0
    cached_tokens: int | None = None
    tiers: dict | None = None  # the reference engine's per-tier token counts
    finish_reason: str | None = None  # the server's (stop, length, ...), and which stop matched
    stop_reason: str | None = None
    model: str | None = None
    error: str | None = None

    @property
    def ttft_s(self) -> float | None:
        return self.token_times_s[0] - self.sent_s if self.token_times_s else None

    @property
    def itl_s(self) -> float | None:
        times = self.token_times_s
        return (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else None

    @property
    def e2e_s(self) -> float | None:
        return None if self.done_s is None else self.done_s - self.sent_s


def stream_completion(url: str, prompt_ids: list[int], max_tokens: int, *, model: str | None = None,
                      request_id: str | None = None, kv_transfer_params: dict | None = None,
                      timeout_s: float = 300.0, clock: Callable[[], float] = time.time) -> Completion:
    """POST ``/v1/completions`` with ``stream: true``; never raises for HTTP or network errors.

    ``request_id`` goes in the ``X-Request-Id`` header (vLLM names the request after it);
    ``kv_transfer_params`` in the body (vLLM hands it to its KV connector: kvtier's records
    take the session id and turn from it)."""
    parts = urlsplit(url)
    body = {"prompt": prompt_ids, "max_tokens": max_tokens, "stream": True, "temperature": 0,
            "ignore_eos": True, "stream_options": {"include_usage": True}}
    if model:
        body["model"] = model
    if kv_transfer_params:
        body["kv_transfer_params"] = kv_transfer_params
    headers = {"Content-Type": "application/json"}
    if request_id:
        headers["X-Request-Id"] = request_id
    connection = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=timeout_s)
    result = Completion(clock())
    try:
        connection.request("POST", "/v1/completions", json.dumps(body), headers)
        response = connection.getresponse()
        if response.status != 200:
            result.error = f"HTTP {response.status}: {response.read(300).decode(errors='replace')}"
            return result
        _read_events(response, result, clock)
    except (OSError, http.client.HTTPException, ValueError) as error:
        result.error = f"{type(error).__name__}: {error}"
    finally:
        connection.close()
    return result


def _read_events(response, result: Completion, clock) -> None:
    for raw in response:
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            result.done_s = clock()
            return
        chunk = json.loads(data)
        result.model = chunk.get("model") or result.model
        choices = chunk.get("choices") or []
        if choices and choices[0].get("finish_reason"):
            result.finish_reason = choices[0]["finish_reason"]
            stop = choices[0].get("stop_reason")
            result.stop_reason = None if stop is None else str(stop)
        if choices and (choices[0].get("text") or choices[0].get("token_ids")):
            count = len(choices[0].get("token_ids") or [None])
            result.token_times_s.extend([clock()] * count)
            result.output_tokens += count
        usage = chunk.get("usage") or {}
        details = usage.get("prompt_tokens_details") or {}
        if details.get("cached_tokens") is not None:
            result.cached_tokens = details["cached_tokens"]
        if chunk.get("kvtier"):
            result.tiers = chunk["kvtier"]
    result.error = "stream ended without [DONE]"
