"""Helpers for simulator tests: tiny records, random prefix-chained traces, replayed outcomes
written into records."""

import dataclasses
import random

from kvtier.collector.events import RequestRecord


def request(hashes, prompt_tokens=None, block_tokens=4, rid="r", t=0.0):
    hashes = tuple(hashes)
    prompt = len(hashes) * block_tokens if prompt_tokens is None else prompt_tokens
    return RequestRecord(request_id=rid, arrival_s=t, prompt_tokens=prompt,
                         block_hashes=hashes, block_size_tokens=block_tokens)


def measured(record, outcome, tier_config_id=None):
    """The record with a replay's per-tier token counts (a ``RequestOutcome``) filled in, as a
    live probe would write them."""
    return dataclasses.replace(
        record, gpu_hit_tokens=outcome.gpu_hit_tokens,
        cpu_promotion_tokens=outcome.cpu_promotion_tokens,
        cold_promotion_tokens=outcome.cold_promotion_tokens,
        recomputed_tokens=outcome.recompute_tokens,
        tier_config_id=tier_config_id or record.tier_config_id)


def random_prefix_trace(seed, n_requests=300, n_roots=6, max_blocks=12, block_tokens=4):
    """Requests that walk a random trie: ids are prefix-chained like real engine hashes."""
    rng = random.Random(seed)
    children: dict[int, list[int]] = {}
    next_id = n_roots
    records = []
    for i in range(n_requests):
        node = rng.randrange(n_roots)
        path = [node]
        for _ in range(rng.randrange(max_blocks)):
            kids = children.setdefault(node, [])
            if kids and rng.random() < 0.7:
                node = rng.choice(kids)
            else:
                node = next_id
                next_id += 1
                kids.append(node)
            path.append(node)
        prompt = len(path) * block_tokens - rng.randrange(block_tokens)
        records.append(request(path, prompt, block_tokens, rid=f"r{i}", t=float(i)))
    return records
