"""Synthetic traffic of the local traces' kinds, with a shift half way through (for safety).

* :func:`agentic` — tool loops like the WEKA conversations: after ``tool_use`` the agent
  comes back in seconds, after ``end_turn`` a person takes minutes or leaves; contexts grow
  and are compacted. With ``shift`` the second half swaps the two (slow tools, turns
  continued by a script), so a model trained on the first half ranks backwards.
* :func:`mixed` — chat like the Mooncake conversations plus long-document questions (a
  document of 60-200 blocks asked about several times). With ``shift`` documents stop being
  asked again and chats continue more.
* :func:`chat` — chat only, with a hidden engagement that a short first prompt reveals in the
  first half and hides in the second.
"""

from __future__ import annotations

import numpy as np

from kvtier.collector.events import RequestRecord


class _Ids:
    def __init__(self) -> None:
        self.next = 1

    def fresh(self, k: int) -> list[int]:
        ids = list(range(self.next, self.next + k))
        self.next += k
        return ids


def _records(events: list) -> list[RequestRecord]:
    events.sort(key=lambda e: e[0])
    return [RequestRecord(request_id=f"r{i}", arrival_s=t, prompt_tokens=prompt,
                          output_tokens=200, block_hashes=tuple(blocks), block_size_tokens=bt,
                          **extra)
            for i, (t, prompt, blocks, bt, extra) in enumerate(events)]


def agentic(sessions: int = 120, seed: int = 0, *, shift: bool = False, start_gap_s: float = 60.0,
            block_tokens: int = 2048) -> list[RequestRecord]:
    rng = np.random.default_rng(seed)
    ids, events = _Ids(), []
    half = sessions * start_gap_s / 2
    for s in range(sessions):
        t = s * start_gap_s
        context = ids.fresh(int(rng.integers(4, 12)))
        late = shift and t > half
        for _ in range(int(rng.integers(20, 120))):
            api_s = float(rng.lognormal(np.log(5), 0.5))
            stop = "tool_use" if rng.random() < 0.9 else "end_turn"
            events.append((t, len(context) * block_tokens + int(rng.integers(0, block_tokens)),
                           list(context), block_tokens,
                           {"session_id": f"a{s}", "request_type": "main",
                            "finish_status": "stopped", "stop_reason": stop,
                            "e2e_latency_s": api_s}))
            if stop == "tool_use":
                gap = rng.lognormal(np.log(150 if late else 8), 0.7)
            elif rng.random() < 0.3:
                break
            else:
                gap = rng.lognormal(np.log(6 if late else 250), 0.8)
            t += api_s + gap
            context = context + ids.fresh(int(rng.integers(0, 3)))
            if len(context) > 100:  # compaction: a summary replaces the history
                context = context[:8] + ids.fresh(10)
    return _records(events)


def mixed(hours: float = 0.5, seed: int = 0, *, shift: bool = False, rate_per_s: float = 2.0,
          block_tokens: int = 512) -> list[RequestRecord]:
    rng = np.random.default_rng(seed)
    ids, events = _Ids(), []
    end_s, t = hours * 3600, 0.0
    while True:
        t += rng.exponential(1 / rate_per_s)
        if t > end_s:
            break
        late = shift and t > end_s / 2
        if rng.random() < 0.25:  # a document, asked about several times
            document = [0] + ids.fresh(int(rng.integers(60, 200)))
            at = t
            for _ in range(1 if late else int(rng.integers(2, 8))):
                blocks = document + ids.fresh(1)
                events.append((at, len(blocks) * block_tokens - 100, blocks, block_tokens, {}))
                at += rng.lognormal(np.log(90), 0.7)
                if at > end_s:
                    break
            continue
        _chat(rng, ids, events, t, end_s, 0.7 if late else 0.25, block_tokens,
              [0] + ids.fresh(int(np.clip(rng.lognormal(np.log(8), 0.8), 1, 100))))
    return _records(events)


def chat(hours: float = 0.5, seed: int = 0, *, shift: bool = False, rate_per_s: float = 2.0,
         block_tokens: int = 512) -> list[RequestRecord]:
    rng = np.random.default_rng(seed)
    ids, events = _Ids(), []
    end_s, t = hours * 3600, 0.0
    while True:
        t += rng.exponential(1 / rate_per_s)
        if t > end_s:
            break
        engaged = rng.random() < 0.3
        short = engaged != (shift and t > end_s / 2)
        first = int(np.clip(rng.lognormal(np.log(4 if short else 20), 0.5), 1, 200))
        _chat(rng, ids, events, t, end_s, 0.85 if engaged else 0.12, block_tokens,
              [0] + ids.fresh(first))
    return _records(events)


def _chat(rng, ids: _Ids, events: list, t: float, end_s: float, p_continue: float,
          block_tokens: int, blocks: list[int]) -> None:
    for _ in range(30):
        events.append((t, len(blocks) * block_tokens - int(rng.integers(1, block_tokens)),
                       list(blocks), block_tokens, {}))
        if rng.random() > p_continue:
            return
        t += rng.lognormal(np.log(120), 0.8)
        if t > end_s:
            return
        blocks = blocks[:-1] + ids.fresh(int(rng.integers(2, 5)))
