"""Latency fault tolerance (sdk/fault.py) with an injected clock: RocketMQ's MQFaultStrategy."""

from __future__ import annotations

import pytest

from sdk.fault import (
    MQFaultStrategy,
    TopicPublishQueues,
    not_available_duration_ms,
)
from sdk.message import MessageQueue
from tests.conftest import ManualClock


def _queues(brokers: tuple[str, ...] = ("a", "b", "c"), per: int = 2) -> TopicPublishQueues:
    return TopicPublishQueues([MessageQueue("T", b, q) for b in brokers for q in range(per)])


@pytest.mark.parametrize(
    ("latency_ms", "duration_ms"),
    [
        (0, 0),
        (49, 0),
        (100, 0),
        (549, 0),
        (550, 30000),
        (999, 30000),
        (1000, 60000),
        (2000, 120000),
        (3000, 180000),
        (14999, 180000),
        (15000, 600000),
        (30000, 600000),
    ],
)
def test_not_available_duration_follows_rocketmqs_table(latency_ms: int, duration_ms: int) -> None:
    assert not_available_duration_ms(latency_ms) == duration_ms


def test_selection_is_round_robin_over_every_queue_when_all_brokers_are_healthy(clock: ManualClock) -> None:
    strategy = MQFaultStrategy(clock_ms=clock)
    info = _queues()
    picked = [strategy.select(info) for _ in range(12)]
    assert picked[:6] == info.queues
    assert picked[6:] == info.queues


def test_a_failed_broker_is_skipped_until_its_isolation_ends(clock: ManualClock) -> None:
    strategy = MQFaultStrategy(clock_ms=clock)
    info = _queues()
    strategy.update("b", 10, isolation=True)  # a failure: avoided for 600 s
    picked = {strategy.select(info).broker_name for _ in range(30)}
    assert picked == {"a", "c"}
    clock.advance(599_999)
    assert "b" not in {strategy.select(info).broker_name for _ in range(30)}
    clock.advance(1)
    assert "b" in {strategy.select(info).broker_name for _ in range(30)}


def test_a_slow_broker_is_avoided_for_the_duration_its_latency_earns(clock: ManualClock) -> None:
    strategy = MQFaultStrategy(clock_ms=clock)
    info = _queues()
    strategy.update("a", 1200, isolation=False)  # ≥ 1000 ms → 60 s
    strategy.update("c", 80, isolation=False)  # fast: never avoided
    assert {strategy.select(info).broker_name for _ in range(30)} == {"b", "c"}
    clock.advance(60_000)
    assert {strategy.select(info).broker_name for _ in range(30)} == {"a", "b", "c"}


def test_a_retry_avoids_the_broker_that_just_failed_even_before_it_is_reported(clock: ManualClock) -> None:
    strategy = MQFaultStrategy(clock_ms=clock)
    info = _queues(("a", "b"))
    for _ in range(10):
        assert strategy.select(info, last_broker_name="a").broker_name == "b"


def test_when_every_broker_is_unavailable_the_least_bad_one_is_still_chosen(clock: ManualClock) -> None:
    strategy = MQFaultStrategy(clock_ms=clock)
    info = _queues(("a", "b"))
    strategy.update("a", 2500, isolation=False)  # 120 s, latency 2500
    strategy.update("b", 30000, isolation=True)  # 600 s, latency 30000
    picked = [strategy.select(info) for _ in range(6)]
    assert {q.broker_name for q in picked} == {"a"}, "a send never fails just because all brokers were slow"
    assert {q.queue_id for q in picked} == {0, 1}, "and it still spreads over that broker's queues"


def test_a_disabled_strategy_is_plain_round_robin_that_avoids_the_last_broker(clock: ManualClock) -> None:
    strategy = MQFaultStrategy(enabled=False, clock_ms=clock)
    info = _queues(("a", "b"), per=1)
    strategy.update("a", 99999, isolation=True)  # ignored when disabled
    assert {strategy.select(info).broker_name for _ in range(4)} == {"a", "b"}
    assert strategy.select(info, last_broker_name="b").broker_name == "a"
    assert strategy.tolerance.items == {}


def test_selecting_from_a_topic_without_write_queues_is_an_error(clock: ManualClock) -> None:
    with pytest.raises(ValueError, match="no write queues"):
        MQFaultStrategy(clock_ms=clock).select(TopicPublishQueues([]))


def test_with_the_topics_only_broker_marked_sends_go_round_robin_over_its_queues(clock: ManualClock) -> None:
    """The least bad broker takes the sends, each of its queues in turn, not one queue; and
    its queues come back to the plain round robin once the mark ends."""
    strategy = MQFaultStrategy(clock_ms=clock)
    info = _queues(("a",), per=4)
    strategy.update("a", 600, isolation=False)  # slow: avoided for 30 s, but there is no other
    picked = [strategy.select(info) for _ in range(8)]
    assert sorted(picked[:4], key=lambda q: q.queue_id) == info.queues
    assert picked[4:] == picked[:4]
    assert strategy.select(info, last_broker_name="a").broker_name == "a"
    clock.advance(30_000)
    assert {strategy.select(info).queue_id for _ in range(4)} == {0, 1, 2, 3}


def test_queues_by_broker_are_grouped_in_their_order() -> None:
    info = TopicPublishQueues([MessageQueue("T", b, q) for q in range(3) for b in ("b", "a")])
    assert [q.queue_id for q in info.on_broker("a")] == [0, 1, 2]
    assert info.write_queue_count("b") == 3
    assert info.on_broker("z") == []
    assert set(info.brokers()) == {"a", "b"}
