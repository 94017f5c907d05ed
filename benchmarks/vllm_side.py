"""What the benchmarks that drive vLLM's own classes share: the vLLM environment they run in,
one run of the benchmark's own script inside it (its ``--inside`` mode prints one ``RESULT``
line), and the synthetic prompts they send."""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULT = "RESULT "


def vllm_python() -> str | None:
    """The vLLM 0.33 environment's python (make builds it), or ``None``, said on stderr."""
    sys.path.insert(0, str(ROOT))
    from tests.probes.vllm.environments import VLLM_PYTHONS

    python = VLLM_PYTHONS["0.33"]
    if not Path(python).exists():
        print(f"no vLLM environment at {python} (make builds it)", file=sys.stderr)
        return None
    return python


def run_inside(python: str, script: str, options: Sequence[str], env: dict | None = None,
               timeout_s: int = 600) -> dict:
    """``script --inside ...`` in the vLLM environment, kvtier's checkout on its path: the
    object its ``RESULT`` line holds."""
    done = subprocess.run([python, script, *options], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
                          timeout=timeout_s)
    line = next((l for l in done.stdout.splitlines() if l.startswith(RESULT)), None)
    if line is None:
        raise SystemExit(f"the vLLM side failed:\n{done.stderr[-2000:]}")
    return json.loads(line[len(RESULT):])


def report(result: dict) -> None:
    """The ``--inside`` side's answer."""
    print(RESULT + json.dumps(result))


def prompts(requests: int, blocks: int, repeat: float, seed: int = 0) -> Iterator[list[int]]:
    """Each request's block ids: ``blocks`` new ones, or (a ``repeat`` share) an earlier
    prompt again."""
    rng, sent, fresh = random.Random(seed), [], 0
    for _ in range(requests):
        if sent and rng.random() < repeat:
            yield sent[rng.randrange(len(sent))]
            continue
        prompt = list(range(fresh, fresh + blocks))
        fresh += blocks
        sent.append(prompt)
        yield prompt


def add_traffic_arguments(parser: argparse.ArgumentParser, unit: str = "blocks") -> None:
    """The options every such benchmark takes: its prompts, ``--json``, ``--smoke`` and the
    hidden ``--inside`` its vLLM side runs with."""
    parser.add_argument("--requests", type=int, default=12_000, help="requests")
    parser.add_argument("--blocks", type=int, default=8, help=f"{unit} per request")
    parser.add_argument("--repeat", type=float, default=0.3,
                        help="share of requests that send an earlier prompt again")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--smoke", action="store_true", help="tiny inputs, seconds: checks the "
                        "benchmark runs (its figures mean nothing)")
    parser.add_argument("--inside", help=argparse.SUPPRESS)


def traffic_options(args) -> list[str]:
    """The prompts' options again, for the vLLM side's command line."""
    return ["--requests", str(args.requests), "--blocks", str(args.blocks), "--repeat",
            str(args.repeat)]
