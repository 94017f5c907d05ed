"""A store written by kvtier's reference engine under concurrent load: the workload the
engine model's calibration is checked on (tests and ``benchmarks/prediction.py``).

Sessions of growing prompts (each turn repeats the last one's prompt and adds to it, so later
turns hit the GPU or CPU tier), sent by ``concurrency`` client threads over HTTP, each client
sending its next request when the last one ends (closed loop).
"""

from __future__ import annotations

import json
import random
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from kvtier.refengine.config import EngineConfig, TierConfig
from kvtier.refengine.server import MODEL_NAME, EngineServer, ServerSettings

VOCAB = 97


def session_prompts(requests: int, rng: random.Random) -> list[tuple[list[int], int]]:
    """(prompt, max_tokens) per request: sessions of 1-4 turns, prompts 20-600 tokens."""
    out = []
    while len(out) < requests:
        prompt = [rng.randrange(VOCAB) for _ in range(rng.randrange(20, 300))]
        for _ in range(rng.randrange(1, 5)):
            out.append((list(prompt), rng.randrange(2, 16)))
            prompt += [rng.randrange(VOCAB) for _ in range(rng.randrange(10, 120))]
            if len(prompt) > 600:
                break
    return out[:requests]


GPU_BLOCKS = 160  # the engine's GPU tier, in KV blocks


def write_store(path: str | Path, *, concurrency: int, requests: int, seed: int = 0,
                gpu_blocks: int = GPU_BLOCKS, cpu_blocks: int = 400) -> None:
    """Serve ``requests`` through a reference engine at ``concurrency`` into a store at ``path``."""
    config = EngineConfig(layers=2, heads=2, head_dim=16, vocab_size=VOCAB, max_positions=1024,
                          block_size_tokens=16, max_batch_size=8, seed=seed,
                          tiers=TierConfig(gpu_blocks=gpu_blocks, cpu_blocks=cpu_blocks,
                                           config_id="gpu+cpu"))
    work = session_prompts(requests, random.Random(seed))
    server = EngineServer(config, ServerSettings(port=0, store_path=str(path))).start()
    try:
        def client(lane: int) -> None:
            for prompt, max_tokens in work[lane::concurrency]:
                body = json.dumps({"model": MODEL_NAME, "prompt": prompt, "max_tokens": max_tokens}).encode()
                request = urllib.request.Request(server.url + "/v1/completions", body,
                                                 {"Content-Type": "application/json"})
                with urllib.request.urlopen(request, timeout=120) as response:
                    response.read()

        with ThreadPoolExecutor(concurrency) as pool:
            list(pool.map(client, range(concurrency)))
    finally:
        server.stop()
