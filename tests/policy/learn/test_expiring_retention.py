"""Learned retention's decay as TensorRT-LLM priorities that expire (``duration_ms``)."""

from __future__ import annotations

import math

import pytest

from kvtier.policy.cost import CostParams
from kvtier.policy.learn.split import Split
from kvtier.policy.learn.expiring_retention import expiring, expiry_ms
from kvtier.policy.learn.replay import Tiers
from kvtier.policy.recommend.gate import learn
from kvtier.policy.writers.trtllm_retention import RetentionClass, TokenRange
from tests.policy.learn.synthetic import conversations


def test_a_priority_above_the_default_expires_when_its_decayed_value_reaches_it():
    assert expiry_ms(70, 100.0) == round(100_000 * math.log(2))  # value halves to 35's
    assert expiry_ms(100, 10.0) == round(10_000 * math.log(100 / 35))
    assert expiry_ms(36, 1e-6) == 1  # at least a millisecond
    # at or below the default it only falls further: an expiry would raise it to 35
    assert expiry_ms(35, 100.0) is None and expiry_ms(10, 100.0) is None
    assert expiry_ms(90, math.inf) is None  # no decay, no expiry
    with pytest.raises(ValueError, match="tau_s must be > 0"):
        expiry_ms(90, 0.0)


def test_every_range_and_decode_get_their_expiry():
    chat = RetentionClass("chat", (TokenRange(0, 512, 90), TokenRange(512, None, 20)),
                          decode_priority=60)
    (out,) = expiring([chat], 30.0)
    assert [r.duration_ms for r in out.token_ranges] == [expiry_ms(90, 30.0), None]
    assert out.decode_duration_ms == expiry_ms(60, 30.0)
    # the LLM API form carries them, and reads back the same
    assert RetentionClass.from_dict("chat", out.to_dict()) == out


def test_the_recommended_ranges_expire_by_the_tau_chosen_on_the_training_period():
    records = conversations(500, seed=8, block_tokens=512)
    split = Split.by_time(records, 0.5)
    learned = learn(split, Tiers(30, 200), CostParams(), 512,
                    int(len(split.train) * 0.8), seed=3)
    assert 0 < learned.tau_s < math.inf  # this traffic's scores decay
    assert any(r.duration_ms for c in learned.ranges for r in c.token_ranges)
    for c in learned.ranges:
        for r in c.token_ranges:
            assert r.duration_ms == expiry_ms(r.priority, learned.tau_s)
        assert c.decode_duration_ms == expiry_ms(c.decode_priority, learned.tau_s)
