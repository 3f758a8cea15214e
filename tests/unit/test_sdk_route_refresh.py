"""Following route changes: how brokers' refusals are told apart, how a refused send trims the
cached route, and how route refreshes asked for by failures are bounded per topic."""

from __future__ import annotations

import asyncio

import pytest

from data_plane.remoting.codes import ResponseCode
from sdk import errors
from sdk.message import MessageQueue
from sdk.route import TopicRoute, without_write_queues
from sdk.route_refresh import RouteRefreshLimiter


def test_the_brokers_refusals_of_a_stale_route_are_told_apart_from_other_failures() -> None:
    sent = errors.for_code(ResponseCode.SYSTEM_ERROR, "request queueId[6] is illegal, topic[T] queue 6 is gone")
    pulled = errors.for_code(
        ResponseCode.SYSTEM_ERROR, "queueId[5] is illegal, topic:[T] topicConfig.readQueueNums:[4] consumer:[c]"
    )
    for e in (sent, pulled):
        assert isinstance(e, errors.QueueNotServedError)
        assert isinstance(e, errors.BrokerSystemError)  # what code that catches SYSTEM_ERROR sees still
        assert e.retriable
        assert e.invalid_metadata
        assert e.code == ResponseCode.SYSTEM_ERROR
    other = errors.for_code(ResponseCode.SYSTEM_ERROR, "disk full")
    assert type(other) is errors.BrokerSystemError
    assert not other.invalid_metadata
    forbidden = errors.for_code(ResponseCode.NO_PERMISSION, "the topic[T] sending is forbidden")
    assert isinstance(forbidden, errors.TopicNotWritableError)
    assert forbidden.retriable
    assert forbidden.invalid_metadata
    denied = errors.for_code(ResponseCode.NO_PERMISSION, "no permission to SEND_MESSAGE on T")
    assert type(denied) is errors.NoPermissionError
    assert not denied.retriable


def _route(queues: dict[str, int]) -> TopicRoute:
    mqs = tuple(MessageQueue("T", b, i) for b, n in sorted(queues.items()) for i in range(n))
    return TopicRoute("T", mqs, mqs, {b: {0: f"127.0.0.1:{10911 + k}"} for k, b in enumerate(sorted(queues))})


def test_a_refused_queue_and_those_above_it_leave_the_route_for_writes_only() -> None:
    route = _route({"broker-a": 8, "broker-b": 4})
    trimmed = without_write_queues(route, "broker-a", 4)
    assert [(q.broker_name, q.queue_id) for q in trimmed.publish_queues] == [
        *(("broker-a", i) for i in range(4)),
        *(("broker-b", i) for i in range(4)),
    ]
    assert trimmed.subscribe_queues == route.subscribe_queues  # still read (drained) until the route says
    assert [q.broker_name for q in without_write_queues(route, "broker-b").publish_queues] == ["broker-a"] * 8
    assert without_write_queues(trimmed, "broker-a", 6) is trimmed  # nothing to take out: the same route


@pytest.mark.asyncio
async def test_refreshes_asked_for_are_one_a_topic_per_interval_and_none_is_lost() -> None:
    fetched: list[str] = []
    second = asyncio.Event()
    limiter: RouteRefreshLimiter

    async def fetch(topic: str) -> None:
        limiter.fetched(topic)
        fetched.append(topic)
        if fetched.count("T") == 2:
            second.set()

    limiter = RouteRefreshLimiter(fetch, min_interval_s=0.2)
    loop = asyncio.get_running_loop()
    for _ in range(50):  # many sends refused at once
        limiter.ask("T")
    limiter.ask("U")
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert sorted(fetched) == ["T", "U"]
    assert limiter.recent("T")
    t0 = loop.time()
    for _ in range(50):  # refused again within the interval: one refresh at its end
        limiter.ask("T")
    async with asyncio.timeout(5):
        await second.wait()
    assert fetched.count("T") == 2
    assert loop.time() - t0 >= 0.15
    assert limiter.asked == 3
    await limiter.close()
