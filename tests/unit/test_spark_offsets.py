"""Stream offsets (``spark_integration.offsets``): the checkpoint's JSON form, and the fair cap
``maxMessagesPerTrigger`` puts on a micro-batch; the streaming-only options."""

from __future__ import annotations

import random

import pytest

from spark_integration import offsets
from spark_integration.errors import OrbitSparkError
from spark_integration.options import ReadOptions

pytestmark = pytest.mark.unit

NS = {"namesrv": "127.0.0.1:9876"}


def test_json_form_round_trips_sorted() -> None:
    got = {("t", "b", 1): 7, ("t", "b", 0): 3, ("a%x", "b2", 0): 0}
    doc = offsets.to_json(got)
    assert list(doc) == ["a%x", "t"]
    assert list(doc["t"]) == ["b:0", "b:1"]
    assert offsets.from_json(doc) == got
    for bad, message in (
        ([1], "must be a JSON object"),
        ({"t": 3}, "must map"),
        ({"t": {"b0": 1}}, "is not 'broker:queueId'"),
        ({"t": {"b:0": -1}}, "whole number >= 0"),
        ({"t": {"b:0": True}}, "whole number >= 0"),
    ):
        with pytest.raises(OrbitSparkError, match=message):
            offsets.from_json(bad)


def test_cap_shares_the_budget_fairly_and_gives_what_one_queue_cannot_use_to_the_others() -> None:
    a, b, c = ("t", "b", 0), ("t", "b", 1), ("t", "b", 2)
    start = {a: 0, b: 10, c: 5}
    end = {a: 100, b: 12, c: 105}
    capped = offsets.cap(start, end, 50)
    assert capped == {a: 24, b: 12, c: 29}  # b takes its 2; a and c share the other 48
    assert offsets.count(start, capped) == 50
    assert offsets.cap(start, end, 1000) == end
    assert offsets.cap(start, start, 10) == start


def test_cap_never_exceeds_the_budget_nor_moves_a_queue_back(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(200):
        keys = [("t", "b", q) for q in range(rng.randint(1, 6))]
        start = {k: rng.randint(0, 50) for k in keys}
        end = {k: start[k] + rng.randint(0, 40) for k in keys}
        budget = rng.randint(1, 120)
        capped = offsets.cap(start, end, budget)
        assert offsets.count(start, capped) == min(budget, offsets.count(start, end))
        assert all(start[k] <= capped[k] <= end[k] for k in keys)


def test_streaming_only_options() -> None:
    o = ReadOptions.parse({**NS, "topic": "a", "maxMessagesPerTrigger": "15", "commitToGroup": "acme%billing"}, env={})
    assert (o.max_messages_per_trigger, o.commit_to_group) == (15, "acme%billing")
    assert o.check_stream() is o
    with pytest.raises(OrbitSparkError, match=r"maxMessagesPerTrigger is for spark\.readStream only"):
        o.check_batch()
    with pytest.raises(OrbitSparkError, match="a stream has no end"):
        ReadOptions.parse({**NS, "topic": "a", "endingOffsets": "earliest"}, env={}).check_stream()
    with pytest.raises(OrbitSparkError, match="maxMessagesPerTrigger must be >= 1"):
        ReadOptions.parse({**NS, "topic": "a", "maxMessagesPerTrigger": "0"}, env={})
    with pytest.raises(OrbitSparkError, match="commitToGroup must be a consumer group name"):
        ReadOptions.parse({**NS, "topic": "a", "commitToGroup": "no spaces"}, env={})
