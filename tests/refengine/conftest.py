"""Engine fixtures: a tiny configuration and engines that are always closed."""

from __future__ import annotations

import pytest

from kvtier.collector.events import Origin
from kvtier.collector.recorder import Recorder
from kvtier.refengine.config import EngineConfig, TierConfig
from kvtier.refengine.engine import ReferenceEngine
from kvtier.refengine.sequence import Sequence

BLOCK = 4


def tiny_config(tmp_path=None, **tiers) -> EngineConfig:
    """Block size 4; a request of 13 prompt + 4 output tokens needs 5 blocks."""
    file_dir = str(tmp_path / "file-tier") if tmp_path is not None else None
    return EngineConfig(layers=2, heads=2, head_dim=8, vocab_size=97, max_positions=256,
                        block_size_tokens=BLOCK, max_batch_size=4, seed=7,
                        tiers=TierConfig(**tiers), file_dir=file_dir)


def prompt(seed: int, length: int = 13) -> list[int]:
    return [(seed * 31 + i * 7) % 97 for i in range(length)]


def run(engine: ReferenceEngine, request_id: str, tokens: list[int], max_tokens: int = 4) -> Sequence:
    seq = Sequence(request_id, list(tokens), max_tokens, 0.0)
    engine.submit(seq)
    run_until_idle(engine)
    return seq


def run_until_idle(engine: ReferenceEngine, max_steps: int = 1_000_000) -> None:
    """Step until nothing is queued or running, let the tiers' writes finish, and step once
    more to publish the events of writes that completed meanwhile (what a server's loop does
    over time, here at once)."""
    for _ in range(max_steps):
        if not engine.scheduler.running and not engine.queued_requests:
            break
        engine.step()
    engine.kv.flush()
    engine.step()


@pytest.fixture
def recorder() -> Recorder:
    return Recorder(Origin("reference", "test", "test/engine"))


@pytest.fixture
def make_engine(recorder):
    engines = []

    def make(config: EngineConfig, **kwargs) -> ReferenceEngine:
        engine = ReferenceEngine(config, recorder, **kwargs)
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        engine.close()
