"""Requests recorded twice, by the engine that served them and by the load probe that sent
them (as ``kvtier demo`` and ``kvtier load`` store them: the probe's own request ids, engine
``load-probe``, the same instance), in a rollout that replays the same traffic once per tier
configuration. Every figure counts each request once: tiers and blocks from the engine's
records, TTFT/ITL from the probe's; reuse within a configuration, not across replays."""

from __future__ import annotations

import numpy as np
import pytest

from kvtier.collector.batch import EventBatch
from kvtier.collector.events import BlockEvent, Origin, Outcome, RequestRecord, Tier
from kvtier.collector.segments import export_segments
from kvtier.collector.store import TraceStore
from kvtier.dashboard import queries, reuse
from kvtier.dashboard.data import Filters, SegmentData
from kvtier.dashboard.facets import read_facets

T0_S = 1_800_000_000.0
BLOCK_TOKENS = 16
REQUESTS = 40
PHASES = ("act/gpu-only", "act/gpu+cpu")
CLIENT_OVERHEAD_S = 0.005  # the probe sees the engine's TTFT plus the network and HTTP


def _prompts(rng) -> list[tuple[int, ...]]:
    """Two shared prefixes, each prompt with unique blocks after its prefix: the unique
    blocks are looked up once per replay, the prefixes many times."""
    prefixes = [tuple(int(h) for h in rng.integers(1, 2**62, size=3)) for _ in range(2)]
    return [prefixes[n % 2] + tuple(int(h) for h in rng.integers(1, 2**62, size=2)) for n in range(REQUESTS)]


def build(root, *, block_events: bool) -> dict:
    """Write the rollout as segments under ``root``; return what each observer recorded."""
    rng = np.random.default_rng(3)
    prompts = _prompts(rng)
    engine = Origin("reference", "demo-engine", "demo-engine/1")
    probe = Origin("load-probe", "demo-engine", "load-probe/1")
    truth = {"engine_ttft_s": {}, "probe_ttft_s": {}, "probe_itl_s": {}, "gpu_hit_tokens": {}}
    with TraceStore(":memory:", clock=lambda: T0_S) as store:
        for phase_index, phase in enumerate(PHASES):
            engine_rows, probe_rows, events = [], [], []
            for n, hashes in enumerate(prompts):
                arrival_s = T0_S + 600 * phase_index + n * 0.5
                cached = 0 if n < 2 else 3  # the prefix hits after its first use
                promoted = 2 if phase_index == 1 and n >= 2 else 0
                recomputed = len(hashes) - cached - promoted
                ttft_s = 0.01 + 0.002 * recomputed * float(rng.lognormal(0, 0.3))
                itl_s = 0.003 * float(rng.lognormal(0, 0.2))
                tokens = {"gpu_hit_tokens": cached * BLOCK_TOKENS, "cpu_promotion_tokens": promoted * BLOCK_TOKENS,
                          "recomputed_tokens": recomputed * BLOCK_TOKENS}
                common = dict(prompt_tokens=len(hashes) * BLOCK_TOKENS, output_tokens=8, block_hashes=hashes,
                              block_size_tokens=BLOCK_TOKENS, tier_config_id=phase, **tokens)
                engine_rows.append(RequestRecord(f"cmpl-{phase_index}-{n}", arrival_s, ttft_s=ttft_s,
                                                 itl_s=itl_s * 0.9, **common))
                probe_rows.append(RequestRecord(f"load-{phase_index}-{n}", arrival_s - 0.002,
                                                ttft_s=ttft_s + CLIENT_OVERHEAD_S, itl_s=itl_s, **common))
                truth["engine_ttft_s"].setdefault(phase, []).append(ttft_s)
                truth["probe_ttft_s"].setdefault(phase, []).append(ttft_s + CLIENT_OVERHEAD_S)
                truth["probe_itl_s"].setdefault(phase, []).append(itl_s)
                truth["gpu_hit_tokens"][phase] = truth["gpu_hit_tokens"].get(phase, 0) + cached * BLOCK_TOKENS
                if block_events:
                    for position, block_hash in enumerate(hashes):
                        kind = (Outcome.GPU_HIT if position < cached else Outcome.CPU_PROMOTION
                                if position < cached + promoted else Outcome.RECOMPUTE_MISS)
                        events.append(BlockEvent(arrival_s + 0.001 * position, kind, block_hash,
                                                 request_id=f"cmpl-{phase_index}-{n}", position=position,
                                                 tier_from=Tier.CPU if kind == Outcome.CPU_PROMOTION else None,
                                                 latency_s=0.001))
                    if phase_index == 0:  # stores name no request, as engines write them
                        for position, block_hash in enumerate(hashes[cached:], start=cached):
                            events.append(BlockEvent(arrival_s + 0.01, Outcome.STORE, block_hash,
                                                     tier_to=Tier.GPU))  # newly computed
                            if position >= 3:  # the prompt's own blocks, offloaded
                                events.append(BlockEvent(arrival_s + 0.02, Outcome.STORE, block_hash,
                                                         tier_from=Tier.GPU, tier_to=Tier.CPU))
            store.ingest(EventBatch.from_rows(engine, phase_index, events, engine_rows))
            store.ingest(EventBatch.from_rows(probe, phase_index, [], probe_rows))
        export_segments(store, root)
    truth["prompts"] = prompts
    return truth


@pytest.fixture(scope="module", params=[True, False], ids=["block-events", "requests-only"])
def observed(request, tmp_path_factory):
    root = tmp_path_factory.mktemp("observed") / "segments"
    truth = build(root, block_events=request.param)
    with SegmentData(root) as data:
        yield data, truth, request.param


def test_each_request_is_counted_once_per_phase(observed):
    data, _, _ = observed
    facets = read_facets(data)
    assert facets.phases.set_index("tier_config")["requests"].to_dict() == dict.fromkeys(PHASES, REQUESTS)
    assert facets.requests == REQUESTS * len(PHASES)
    assert set(facets.engines) == {"reference", "load-probe"}  # both still selectable


def test_ttft_and_itl_are_the_load_probes_client_side_figures(observed):
    data, truth, _ = observed
    frame = queries.request_latency(data, Filters())
    assert set(frame["requests"]) == {REQUESTS}
    for phase in PHASES:
        for metric, values in (("ttft", truth["probe_ttft_s"][phase]), ("itl", truth["probe_itl_s"][phase])):
            got = frame[(frame["tier_config"] == phase) & (frame["metric"] == metric)].set_index("quantile")
            for quantile, q in (("p50", 50), ("p99", 99)):
                assert got.loc[quantile, "latency_ms"] == pytest.approx(np.percentile(values, q) * 1e3)
    over_time = queries.latency_over_time(data, Filters(), (T0_S, T0_S + 1200))
    ttft = over_time[over_time["metric"] == "ttft"].groupby("tier_config")["requests"].sum()
    assert ttft.to_dict() == dict.fromkeys(PHASES, REQUESTS)


def test_choosing_the_engine_in_the_sidebar_shows_its_own_latency(observed):
    data, truth, _ = observed
    frame = queries.request_latency(data, Filters(engines=("reference",)))
    got = frame[(frame["tier_config"] == PHASES[0]) & (frame["metric"] == "ttft")].set_index("quantile")
    assert got.loc["p50", "requests"] == REQUESTS
    assert got.loc["p50", "latency_ms"] == pytest.approx(np.percentile(truth["engine_ttft_s"][PHASES[0]], 50) * 1e3)


def test_hit_quality_counts_each_lookup_once(observed):
    data, truth, with_events = observed
    frame, unit = queries.hit_quality(data, Filters(), (T0_S, T0_S + 1200),
                                      "blocks" if with_events else "tokens")
    totals = queries.outcome_totals(frame).set_index(["tier_config", "outcome"])["amount"]
    scale = 1 / BLOCK_TOKENS if with_events else 1  # blocks from events, else tokens
    assert unit == ("blocks" if with_events else "tokens")
    for phase in PHASES:
        assert totals[(phase, "gpu_hit")] == truth["gpu_hit_tokens"][phase] * scale
        assert totals.loc[phase].sum() == sum(len(h) for h in truth["prompts"]) * (1 if with_events else BLOCK_TOKENS)
    # the headline is tokens either way: the engine's own per-request split
    frame, unit = queries.hit_quality(data, Filters(), (T0_S, T0_S + 1200))
    tokens = queries.outcome_totals(frame).set_index(["tier_config", "outcome"])["amount"]
    assert unit == "tokens"
    for phase in PHASES:
        assert tokens[(phase, "gpu_hit")] == truth["gpu_hit_tokens"][phase]


def test_reuse_counts_uses_within_each_configuration(observed):
    """The rollout replays every prompt once per configuration: a block used by one prompt
    only is never reused, however many configurations replayed it."""
    data, truth, _ = observed
    uses: dict[int, int] = {}
    for hashes in truth["prompts"]:
        for h in hashes:
            uses[h] = uses.get(h, 0) + 1
    once = sum(1 for n in uses.values() if n == 1)
    classes = reuse.ReuseAnalysis(data, Filters()).classes().set_index("rank")["blocks"]
    assert classes.sum() == len(uses) * len(PHASES)  # distinct blocks per configuration
    assert classes.loc[0] == once * len(PHASES)      # 80 unique blocks per replay
    assert classes.loc[0] / classes.sum() == pytest.approx(80 / 86)
    only_second = reuse.ReuseAnalysis(data, Filters(tier_configs=(PHASES[1],))).classes()
    assert only_second.set_index("rank")["blocks"].to_dict() == {0: once, 4: 6}  # 6 prefix blocks, 20 uses each
    gaps = reuse.ReuseAnalysis(data, Filters()).gaps()
    assert gaps["gap_end_s"].max() <= 100  # no gap spans a replay (600 s apart)
    assert gaps["uses"].sum() == sum(n - 1 for n in uses.values()) * len(PHASES)


def test_latency_source_must_be_named():
    with SegmentData("/nonexistent") as data, pytest.raises(ValueError, match="purpose must be"):
        data.requests(Filters(), "latency")


def test_stores_never_promoted_count_offload_within_each_configuration(observed):
    """The first configuration offloads each prompt's own blocks to the CPU tier; the second
    promotes them, but from its own tiers: the first's stores bought nothing. Writes into the
    GPU tier are newly computed blocks, not offload traffic."""
    data, _, with_events = observed
    if not with_events:  # stores are block events: without them there is nothing to count
        assert reuse.stores_never_promoted(data, Filters()) == {"stored_blocks": 0, "never_promoted": 0}
        return
    unique = 2 * REQUESTS
    assert reuse.stores_never_promoted(data, Filters()) == {"stored_blocks": unique, "never_promoted": unique}
    assert reuse.stores_never_promoted(data, Filters(tier_configs=(PHASES[0],)))["stored_blocks"] == unique
    assert reuse.stores_never_promoted(data, Filters(tier_configs=(PHASES[1],)))["stored_blocks"] == 0
