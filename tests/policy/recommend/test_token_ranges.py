"""Token-range retention per request class, from learned per-offer priorities (TensorRT-LLM)."""

from __future__ import annotations

from kvtier.policy.recommend.token_ranges import (
    band_priorities,
    range_priorities,
    retention_classes,
)
from kvtier.policy.writers.trtllm_retention import RetentionClass, TokenRange
from tests.policy.learn.synthetic import record

CHAT = list(range(1, 21))  # 20 blocks of 16 tokens: depths 0..19
BATCH = list(range(100, 105))
RECORDS = [record(0, CHAT, request_type="chat"), record(1, BATCH, request_type="batch"),
           record(2, [200, 201])]
OFFERS = {(0, 1): 90, (0, 2): 80, (0, 3): 80, (0, 10): 20, (0, 18): 20,  # chat
          (1, 100): 10, (1, 104): 40,                                     # batch: depths 0, 4
          (2, 201): 60}                                                    # no type: depth 1


def test_each_request_class_gets_its_ranges_merged_filled_and_decode_at_the_tail():
    by_name = {c.name: c for c in retention_classes(RECORDS, OFFERS, 16)}
    # chat: depth 0 -> 90, depths 1-3 -> 80, 4-15 and 16+ -> 20 (merged into one open range)
    assert by_name["chat"] == RetentionClass("chat", (
        TokenRange(0, 16, 90), TokenRange(16, 64, 80), TokenRange(64, None, 20)), 20)
    # batch has no offer at depths 1-3 nor 16+: they take the band before
    assert by_name["batch"] == RetentionClass("batch", (
        TokenRange(0, 64, 10), TokenRange(64, None, 40)), 40)
    # a request without a type is in the default class; a leading empty band takes the next
    assert by_name["default"] == RetentionClass("default", (TokenRange(0, None, 60),), 60)


def test_offers_get_the_priority_their_class_range_assigns():
    classes = retention_classes(RECORDS, OFFERS, 16)
    assigned = range_priorities(RECORDS, OFFERS, classes, 16)
    assert assigned == {(0, 1): 90, (0, 2): 80, (0, 3): 80, (0, 10): 20, (0, 18): 20,
                        (1, 100): 10, (1, 104): 40, (2, 201): 60}
    offers = {**OFFERS, (0, 3): 0, (0, 4): 80}  # one low block among highs: the median rules
    classes = retention_classes(RECORDS, offers, 16)
    assert range_priorities(RECORDS, offers, classes, 16)[(0, 3)] == 80


def test_bands_over_all_classes_keep_their_token_names():
    assert band_priorities(RECORDS, OFFERS, 16) == {
        "tokens_0_16": 50, "tokens_16_64": 80, "tokens_64_256": 30, "tokens_256_end": 20}
