"""The SDK's push consumer against real name server and broker processes: clustering and
broadcasting, tag filters, long polling, offsets across a restart, local redelivery, flow
control, per-key order across a rebalance, and at-least-once delivery when a consumer process is
killed with SIGKILL."""

from __future__ import annotations

import asyncio
import functools
import os
import signal
import subprocess
import sys
import time
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from sdk import (
    ConsumeResult,
    Message,
    MessageExt,
    MessageQueue,
    Producer,
    PushConsumer,
)
from sdk.admin import AdminClient
from tests.integration import helpers
from tests.integration.helpers import QUICK, collecting, create_topic

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
DEADLINE_S = 30.0
until = functools.partial(helpers.until, timeout_s=DEADLINE_S)


@pytest.mark.asyncio
async def test_clustering_splits_the_queues_and_consumes_each_message_once(namesrv_addr: str) -> None:
    await create_topic(namesrv_addr, "Split", 4)
    c1, got1 = collecting("g", namesrv_addr, "Split", "c1")
    c2, got2 = collecting("g", namesrv_addr, "Split", "c2")
    await c1.start()
    await c2.start()
    try:
        await until(
            lambda: len(c1.assignment()) == 2 and len(c2.assignment()) == 2 and not c1.assignment() & c2.assignment(),
            "the two members to split four queues",
        )
        async with Producer("p", namesrv_addrs=namesrv_addr) as producer:
            for i in range(40):
                await producer.send(Message("Split", b"%d" % i))
        await until(lambda: len(got1) + len(got2) >= 40, "all 40 messages")
    finally:
        await c1.shutdown()
        await c2.shutdown()
    bodies = sorted(m.body for m in got1 + got2)
    assert bodies == sorted(b"%d" % i for i in range(40)), "each message exactly once"
    assert got1
    assert got2
    assert not {m.message_queue for m in got1} & {m.message_queue for m in got2}


@pytest.mark.asyncio
async def test_starting_warns_of_a_missing_topic_but_not_of_the_groups_own_retry_topic(
    namesrv_addr: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The retry topic ``%RETRY%<group>`` does not exist until the first heartbeat makes it; a
    topic the user subscribed that nobody created is worth the warning."""
    await create_topic(namesrv_addr, "Quiet", 2)
    c, _got = collecting("fresh-group", namesrv_addr, "Quiet", "c1")
    c.subscribe("NeverCreated", "*")
    with caplog.at_level("DEBUG", logger="sdk.consumer"):
        await c.start()
        await c.shutdown()
    misses = [r for r in caplog.records if "no route for" in r.getMessage()]
    warned = {r.getMessage().split("no route for ")[1].split(" yet")[0] for r in misses if r.levelname == "WARNING"}
    assert warned == {"NeverCreated"}, [r.getMessage() for r in misses]


@pytest.mark.asyncio
async def test_broadcasting_gives_every_member_every_message(namesrv_addr: str, tmp_path: Path) -> None:
    await create_topic(namesrv_addr, "Broadcast", 4)
    opts = {"message_model": "BROADCASTING", "offset_store_dir": str(tmp_path / "offsets")}
    c1, got1 = collecting("bg", namesrv_addr, "Broadcast", "b1", **opts)
    c2, got2 = collecting("bg", namesrv_addr, "Broadcast", "b2", **opts)
    await c1.start()
    await c2.start()
    try:
        await until(lambda: len(c1.assignment()) == 4 and len(c2.assignment()) == 4, "both members to take every queue")
        async with Producer("p", namesrv_addrs=namesrv_addr) as producer:
            for i in range(20):
                await producer.send(Message("Broadcast", b"%d" % i))
        await until(lambda: len(got1) >= 20 and len(got2) >= 20, "both members to get all 20")
    finally:
        await c1.shutdown()
        await c2.shutdown()
    expected = sorted(b"%d" % i for i in range(20))
    assert sorted(m.body for m in got1) == expected
    assert sorted(m.body for m in got2) == expected
    files = sorted(p.relative_to(tmp_path / "offsets").as_posix() for p in (tmp_path / "offsets").rglob("*.json"))
    assert files == ["b1/bg.json", "b2/bg.json"], "each member keeps its own progress locally"


@pytest.mark.asyncio
async def test_only_messages_with_subscribed_tags_are_delivered(namesrv_addr: str) -> None:
    await create_topic(namesrv_addr, "Tagged", 1)
    c, got = collecting("tg", namesrv_addr, "Tagged", "t1", expression="TagA || TagC")
    await c.start()
    try:
        async with Producer("p", namesrv_addrs=namesrv_addr) as producer:
            for i, tag in enumerate(["TagA", "TagB", None, "TagC", "TagAB", "taga", "TagA"] * 3):
                await producer.send(Message("Tagged", f"{i}:{tag}".encode(), tags=tag))
            await producer.send(Message("Tagged", b"last", tags="TagC"))  # one queue: it comes after all others
        await until(lambda: any(m.body == b"last" for m in got), "the last message")
    finally:
        await c.shutdown()
    assert [m.tags for m in got] == ["TagA", "TagC", "TagA"] * 3 + ["TagC"]


@pytest.mark.asyncio
async def test_a_message_sent_while_a_pull_is_held_arrives_long_before_the_suspend_time(namesrv_addr: str) -> None:
    await create_topic(namesrv_addr, "LongPoll", 1)
    c, got = collecting("lp", namesrv_addr, "LongPoll", "l1", pull_suspend_ms=15000)
    try:
        async with Producer("p", namesrv_addrs=namesrv_addr) as producer:
            await producer.send(Message("LongPoll", b"warm-up"))  # connections and routes ready
            await c.start()
            # One pull held per queue: the topic's and the group's retry queue.
            await until(lambda: len(got) == 1 and c._pulls_in_flight == 2, "the warm-up, then pulls in flight")
            pulls = c.pulls_sent
            await asyncio.sleep(0.5)  # an idle queue: the one pull stays held at the broker
            assert c.pulls_sent == pulls, "no re-pull while nothing arrives: the pull is held, not answered empty"
            t0 = time.monotonic()
            await producer.send(Message("LongPoll", b"wake"))
            await until(lambda: any(m.body == b"wake" for m in got), "the message", timeout_s=15)
            latency_s = time.monotonic() - t0
    finally:
        await c.shutdown()
    assert latency_s < 1.5, f"arrived after {latency_s:.3f} s of a 15 s suspend"


@pytest.mark.asyncio
async def test_a_consumer_holds_more_pulls_than_a_connections_requests_in_flight(
    namesrv: Any, start_broker: Any
) -> None:
    """One pull held a queue: a consumer of more queues than the broker lets a connection have
    requests being handled (here 8, 4,096 by default) still has every pull held, is woken on
    each queue, and its offsets are taken — held pulls wait, they are not work."""
    start_broker(namesrv.address, "--set", "max_requests_in_flight_per_connection=8")
    namesrv_addr = namesrv.address
    await create_topic(namesrv_addr, "Wide", 32)
    c, got = collecting("wide", namesrv_addr, "Wide", "w1", pull_suspend_ms=15000)
    await c.start()
    try:
        # 33 held: the topic's 32 queues and the group's retry queue
        await until(lambda: c._pulls_in_flight == 33, "a pull in flight for every queue")
        pulls = c.pulls_sent
        await asyncio.sleep(0.5)
        assert c.pulls_sent == pulls, "no pull answered and sent again: every one is held"
        async with Producer("p", namesrv_addrs=namesrv_addr) as producer:
            t0 = time.monotonic()
            for q in range(32):

                def queue_q(qs: Sequence[MessageQueue], _m: Message, q: int = q) -> MessageQueue:
                    return next(m for m in qs if m.queue_id == q)

                await producer.send(Message("Wide", b"%d" % q), queue_selector=queue_q)
            # a refused pull is tried again after pull_retry_delay_ms (3 s): well within that
            await until(lambda: len(got) == 32, "a message from each of the 32 queues", timeout_s=10)
            latency_s = time.monotonic() - t0
        assert latency_s < 2.0, f"the 32 messages took {latency_s:.3f} s"
        assert sorted(m.queue_id for m in got) == list(range(32))
        async with AdminClient(namesrv_addr) as admin:

            async def committed() -> list[int]:
                return [p.consumer_offset for p in await admin.group_progress("wide", "Wide")]

            deadline = time.monotonic() + DEADLINE_S
            while await committed() != [1] * 32:
                assert time.monotonic() < deadline, f"offsets committed: {await committed()}"
                await asyncio.sleep(0.1)
    finally:
        await c.shutdown()


@pytest.mark.asyncio
async def test_committed_offsets_survive_a_consumer_restart(namesrv_addr: str) -> None:
    await create_topic(namesrv_addr, "Restart", 4)
    async with Producer("p", namesrv_addrs=namesrv_addr) as producer:
        for i in range(20):
            await producer.send(Message("Restart", b"old-%d" % i))
        c, got = collecting("rg", namesrv_addr, "Restart", "first")
        await c.start()
        try:
            await until(lambda: len(got) >= 20, "the first 20 messages")
        finally:
            await c.shutdown()  # persists the offsets
        for i in range(20):
            await producer.send(Message("Restart", b"new-%d" % i))
    c2, got2 = collecting("rg", namesrv_addr, "Restart", "second")  # FIRST_OFFSET: only matters without offsets
    await c2.start()
    try:
        await until(lambda: len(got2) >= 20, "the 20 new messages")
    finally:
        await c2.shutdown()
    # Within a queue old messages come before new ones: had the offsets been lost, the old
    # ones would have arrived before the last new one.
    assert sorted(m.body for m in got2) == sorted(b"new-%d" % i for i in range(20))


@pytest.mark.asyncio
async def test_reconsume_later_redelivers_the_message_to_this_consumer(namesrv: Any, start_broker: Any) -> None:
    # Redelivery goes through the broker's retry topic: a 1 s ladder instead of 10 s 30 s ...
    start_broker(namesrv.address, "--set", "message_delay_level=" + " ".join(["1s"] * 18))
    namesrv_addr = namesrv.address
    await create_topic(namesrv_addr, "Retry", 2)
    c = PushConsumer("rl", namesrv_addrs=namesrv_addr, instance_name="r1", reconsume_delay_ms=100, **QUICK)
    c.subscribe("Retry")
    seen: list[tuple[bytes, int]] = []

    async def listener(msgs: list[MessageExt]) -> ConsumeResult:
        seen.extend((m.body, m.reconsume_times) for m in msgs)
        if msgs[0].reconsume_times == 0:
            return ConsumeResult.RECONSUME_LATER
        if msgs[0].body == b"boom" and msgs[0].reconsume_times < 2:
            raise RuntimeError("a listener error counts as RECONSUME_LATER")
        return ConsumeResult.SUCCESS

    c.on_message(listener)
    await c.start()
    try:
        async with Producer("p", namesrv_addrs=namesrv_addr) as producer:
            for body in (b"a", b"b", b"boom"):
                await producer.send(Message("Retry", body))
        await until(lambda: (b"boom", 2) in seen and (b"a", 1) in seen and (b"b", 1) in seen, "the redeliveries")
        await until(lambda: c.consumed_count == 3, "three successes")
    finally:
        await c.shutdown()
    assert sorted(seen) == [(b"a", 0), (b"a", 1), (b"b", 0), (b"b", 1), (b"boom", 0), (b"boom", 1), (b"boom", 2)]


@pytest.mark.asyncio
async def test_pulling_pauses_while_the_queue_cache_is_full(namesrv_addr: str) -> None:
    await create_topic(namesrv_addr, "Flow", 1)
    gate = asyncio.Event()
    done: list[bytes] = []
    c = PushConsumer(
        "fc", namesrv_addrs=namesrv_addr, instance_name="f1", max_cached_messages_per_queue=10, pull_batch_size=5,
        consume_concurrency=2, **QUICK,
    )  # fmt: skip
    c.subscribe("Flow")

    async def listener(msgs: list[MessageExt]) -> ConsumeResult:
        await gate.wait()
        done.extend(m.body for m in msgs)
        return ConsumeResult.SUCCESS

    c.on_message(listener)
    async with Producer("p", namesrv_addrs=namesrv_addr) as producer:
        await producer.send_batch([Message("Flow", b"%d" % i) for i in range(100)])
    await c.start()
    try:
        mq = MessageQueue("Flow", "broker-a", 0)
        await until(lambda: mq in c._pqs and c._pqs[mq].count >= 10, "the cache to fill")
        await asyncio.sleep(0.5)  # time for more pulls, were they not paused
        cached = c._pqs[mq].count
        assert 10 <= cached <= 15, f"{cached} cached: the limit is 10 (+ one pull of 5 that crossed it)"
        gate.set()
        await until(lambda: len(done) == 100, "every message once the listener moves again")
    finally:
        await c.shutdown()
    assert sorted(done) == sorted(b"%d" % i for i in range(100))


@pytest.mark.asyncio
async def test_an_orderly_listener_that_suspends_gets_the_same_message_again_before_the_next(
    namesrv_addr: str,
) -> None:
    await create_topic(namesrv_addr, "Suspend", 1)
    c = PushConsumer("sg", namesrv_addrs=namesrv_addr, instance_name="s1", suspend_current_queue_ms=100, **QUICK)
    c.subscribe("Suspend")
    calls: list[tuple[bytes, int]] = []

    async def listener(msgs: list[MessageExt]) -> ConsumeResult:
        (m,) = msgs
        calls.append((m.body, m.reconsume_times))
        if m.body == b"1" and m.reconsume_times < 2:
            return ConsumeResult.SUSPEND_CURRENT_QUEUE_A_MOMENT
        return ConsumeResult.SUCCESS

    c.on_message_orderly(listener)
    async with Producer("p", namesrv_addrs=namesrv_addr) as producer:
        for i in range(4):
            await producer.send(Message("Suspend", b"%d" % i))
    await c.start()
    try:
        await until(lambda: c.consumed_count == 4, "all four consumed")
    finally:
        await c.shutdown()
    assert calls == [(b"0", 0), (b"1", 0), (b"1", 1), (b"1", 2), (b"2", 0), (b"3", 0)]


@pytest.mark.asyncio
async def test_a_shutdown_during_a_queue_drop_finishes_the_drop(namesrv_addr: str) -> None:
    """o1 is handing queue 1 over to a new member (its listener still busy with "hold") when it
    is shut down: the drop completes — the call in flight commits, the offset is persisted, the
    lock released — so o2 takes the queue at once (not after the broker's 60 s lock expiry) and
    goes on after "hold"."""
    await create_topic(namesrv_addr, "Drop", 2)
    gate, entered = asyncio.Event(), asyncio.Event()
    got: dict[str, list[tuple[int, bytes]]] = {"m1": [], "m2": []}
    first: list[str] = []  # m1's client id

    class FirstKeepsQueueZero:
        """Both members' strategy: m1 alone takes every queue; with company, queue 0 only."""

        name = "TEST"

        def allocate(self, group: str, cid: str, mqs: Any, cids: Any) -> list[MessageQueue]:
            if len(cids) == 1:
                return list(mqs)
            return [q for q in mqs if (q.queue_id == 0) == (cid == first[0])]

    def orderly(name: str) -> PushConsumer:
        c = PushConsumer("dg", namesrv_addrs=namesrv_addr, instance_name=name, allocate=FirstKeepsQueueZero(), **QUICK)
        c.subscribe("Drop")

        async def listener(msgs: list[MessageExt]) -> ConsumeResult:
            for m in msgs:
                if m.body == b"hold" and name == "m1":
                    entered.set()
                    await gate.wait()
                got[name].append((m.queue_id, m.body))
            return ConsumeResult.SUCCESS

        c.on_message_orderly(listener)
        return c

    def to_queue_1(queues: Sequence[MessageQueue], msg: Message) -> MessageQueue:
        return next(q for q in queues if q.queue_id == 1)

    c1, c2 = orderly("m1"), orderly("m2")
    await c1.start()
    first.append(c1.client_id)
    try:
        await until(lambda: len(c1.assignment()) == 2, "m1 to hold both queues")
        async with Producer("p", namesrv_addrs=namesrv_addr) as producer:
            for body in (b"a", b"b", b"hold"):
                await producer.send(Message("Drop", body), queue_selector=to_queue_1)
            await until(entered.is_set, "m1's listener to be busy with 'hold'")
            await c2.start()
            await until(lambda: {mq.queue_id for mq in c1.assignment() if mq.topic == "Drop"} == {0}, "m1 dropping 1")
            stopping = asyncio.create_task(c1.shutdown())
            await asyncio.sleep(0)  # the shutdown is under way (its first step is synchronous)
            assert not stopping.done()
            gate.set()
            await asyncio.wait_for(stopping, DEADLINE_S)
            assert got["m1"] == [(1, b"a"), (1, b"b"), (1, b"hold")]
            await producer.send(Message("Drop", b"after"), queue_selector=to_queue_1)
            await until(lambda: (1, b"after") in got["m2"], "m2 to consume queue 1", timeout_s=20)
        assert got["m2"] == [(1, b"after")], "m2 started queue 1 where m1's drop committed it"
    finally:
        await c1.shutdown()
        await c2.shutdown()


def _keys_covering(queues: int, per_queue: int) -> list[str]:
    """Sharding keys such that every queue gets ``per_queue`` of them."""
    by_queue: dict[int, list[str]] = {q: [] for q in range(queues)}
    i = 0
    while any(len(v) < per_queue for v in by_queue.values()):
        key = f"key-{i}"
        q = zlib.crc32(key.encode()) % queues
        if len(by_queue[q]) < per_queue:
            by_queue[q].append(key)
        i += 1
    return [k for v in by_queue.values() for k in v]


@pytest.mark.asyncio
async def test_per_key_order_is_kept_while_a_third_member_joins(namesrv_addr: str) -> None:
    await create_topic(namesrv_addr, "Ordered", 8)
    keys = _keys_covering(8, 2)
    rounds = 60
    log: list[tuple[str, str, int]] = []  # (member, key, seq) in the order the listeners ran

    def orderly(name: str) -> PushConsumer:
        c = PushConsumer("og", namesrv_addrs=namesrv_addr, instance_name=name, **QUICK)
        c.subscribe("Ordered")

        async def listener(msgs: list[MessageExt]) -> ConsumeResult:
            for m in msgs:
                key, seq = m.body.decode().split(":")
                log.append((name, key, int(seq)))
            await asyncio.sleep(0.002)
            return ConsumeResult.SUCCESS

        c.on_message_orderly(listener)
        return c

    c1, c2, c3 = orderly("o1"), orderly("o2"), orderly("o3")
    await c1.start()
    await c2.start()
    try:
        await until(lambda: len(c1.assignment()) == 4 and len(c2.assignment()) == 4, "two members with 4 queues each")
        async with Producer("p", namesrv_addrs=namesrv_addr) as producer:
            for seq in range(rounds):
                if seq == rounds // 3:
                    await c3.start()
                for key in keys:
                    await producer.send(Message("Ordered", f"{key}:{seq}".encode()), sharding_key=key)
                await asyncio.sleep(0.01)
        await until(
            lambda: sorted(len(c.assignment()) for c in (c1, c2, c3)) == [2, 3, 3], "the third member to get its share"
        )
        await until(lambda: len({(k, s) for _, k, s in log}) == len(keys) * rounds, "every message")
    finally:
        for c in (c1, c2, c3):
            await c.shutdown()
    for key in keys:
        seqs = [s for _, k, s in log if k == key]
        highest = -1
        for s in seqs:
            if s > highest:
                assert s == highest + 1, f"{key}: {s} came before {highest + 1} ({seqs})"
                highest = s
            # s <= highest: a redelivery of a message already consumed (at least once), never a jump
        assert highest == rounds - 1
    moved = {k for k in keys if len({m for m, kk, _ in log if kk == k}) > 1}
    assert moved, "some key's queue changed hands during the test"
    assert any(m == "o3" for m, _, _ in log), "the new member consumed"


CHILD = r"""
import asyncio, sys
from sdk import ConsumeResult, PushConsumer

namesrv, group, topic, out_path, ready_path = sys.argv[1:6]

async def main():
    c = PushConsumer(group, namesrv_addrs=namesrv, instance_name="child", consume_from="FIRST_OFFSET",
                     heartbeat_interval_ms=2000, rebalance_interval_ms=1000, persist_interval_ms=300)
    c.subscribe(topic)
    out = open(out_path, "ab", buffering=0)

    async def listener(msgs):
        await asyncio.sleep(0.005)
        for m in msgs:
            out.write(m.body + b"\n")  # before SUCCESS: whatever is committed was recorded
        return ConsumeResult.SUCCESS

    c.on_message(listener)
    await c.start()
    while True:
        if c.assignment():
            open(ready_path, "w").close()
        await asyncio.sleep(0.05)

asyncio.run(main())
"""


@pytest.mark.asyncio
async def test_a_killed_members_queues_move_and_every_message_arrives_at_least_once(
    namesrv_addr: str, tmp_path: Path
) -> None:
    heartbeat_ms = 2000
    await create_topic(namesrv_addr, "Kill", 4)
    out, ready = tmp_path / "child.out", tmp_path / "child.ready"
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", CHILD, namesrv_addr, "kg", "Kill", str(out), str(ready),
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    local, got = collecting("kg", namesrv_addr, "Kill", "survivor", heartbeat_interval_ms=heartbeat_ms)
    try:
        await until(ready.exists, "the child consumer to take queues")
        await local.start()
        await until(lambda: len(local.assignment()) == 2, "the two members to split the queues")
        async with Producer("p", namesrv_addrs=namesrv_addr) as producer:
            await asyncio.gather(*(producer.send(Message("Kill", b"m%d" % i)) for i in range(200)))

            def child_lines() -> int:
                return len(out.read_bytes().splitlines()) if out.exists() else 0

            await until(lambda: child_lines() >= 20, "the child to consume")
            child.send_signal(signal.SIGKILL)
            await child.wait()
            killed = time.monotonic()
            await until(lambda: len(local.assignment()) == 4, "the survivor to take every queue")
            moved_s = time.monotonic() - killed
            await asyncio.gather(*(producer.send(Message("Kill", b"m%d" % i)) for i in range(200, 300)))
            expected = {b"m%d" % i for i in range(300)}

            def delivered() -> set[bytes]:
                return {m.body for m in got} | set(out.read_bytes().splitlines())

            await until(lambda: delivered() >= expected, "every message, from one member or the other")
    finally:
        if child.returncode is None:
            child.kill()
            await child.wait()
        await local.shutdown()
    assert moved_s <= 2 * heartbeat_ms / 1000, f"queues moved {moved_s:.2f} s after the kill"
    assert delivered() == expected
