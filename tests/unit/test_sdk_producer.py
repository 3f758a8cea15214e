"""Producer (sdk/producer.py) against a scripted stand-in for the client instance (no sockets):
sharding keys, retries that avoid the failed broker, the fault strategy, validation, batches."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import zlib
from collections.abc import Awaitable, Callable, Sequence

import pytest

from data_plane.remoting.codes import FLAG_RESPONSE, RequestCode, ResponseCode
from data_plane.remoting.command import RemotingCommand
from data_plane.remoting.errors import RemotingConnectError
from data_plane.store.message import decode_properties
from sdk import errors
from sdk.fault import TopicPublishQueues
from sdk.message import Message, MessageQueue, SendStatus
from sdk.pacer import Pacer
from sdk.producer import Producer, select_by_sharding_key
from sdk.route import TopicRoute
from tests.conftest import ManualClock

ADDRS = {"broker-a": "10.0.0.1:10911", "broker-b": "10.0.0.2:10911"}
Answer = Callable[[str, RemotingCommand], RemotingCommand]


def _route(topic: str = "T", per_broker: int = 2) -> TopicRoute:
    queues = tuple(MessageQueue(topic, b, q) for b in sorted(ADDRS) for q in range(per_broker))
    return TopicRoute(topic, queues, queues, {b: {0: a} for b, a in ADDRS.items()})


def _ok(addr: str, cmd: RemotingCommand) -> RemotingCommand:
    ext = cmd.ext_fields or {}
    return RemotingCommand(
        ResponseCode.SUCCESS,
        flag=FLAG_RESPONSE,
        ext_fields={"msgId": "7F" * 16, "queueId": ext["e"], "queueOffset": "5"},
    )


def _a_refuses(addr: str, cmd: RemotingCommand) -> RemotingCommand:
    """broker-a's connection is refused; broker-b answers."""
    if addr == ADDRS["broker-a"]:
        raise errors.ConnectionFailedError("refused", addr=addr)
    return _ok(addr, cmd)


class FakeInstance:
    """Answers sends through ``answer(addr, cmd)``; records every request."""

    client_id = "127.0.0.1@1#test"

    def __init__(self, answer: Answer = _ok, route: TopicRoute | None = None) -> None:
        self.answer = answer
        self.route = route or _route()
        self.sent: list[tuple[str, RemotingCommand]] = []
        self.oneway: list[tuple[str, RemotingCommand]] = []
        self.refreshes = 0
        self.stale: list[tuple[MessageQueue, int | None]] = []  # route_stale calls: (queue, error code)
        self.routes: dict[str, TopicRoute] = {}  # no cached routes: every send asks publish_route
        self.pacer = Pacer()

    def cached_master_addr(self, mq: MessageQueue) -> str | None:
        return None

    async def publish_route(self, topic: str, *, refresh: bool = False) -> TopicRoute:
        self.refreshes += refresh
        return self.route

    async def broker_addr(self, mq: MessageQueue, broker_id: int = 0, *, master_only: bool = False) -> str:
        return ADDRS[mq.broker_name]

    def route_stale(self, mq: MessageQueue, error: errors.OrbitError) -> None:
        self.stale.append((mq, error.code))

    async def invoke(self, addr: str, cmd: RemotingCommand, timeout_ms: int | None = None) -> RemotingCommand:
        self.sent.append((addr, cmd))
        return self.answer(addr, cmd)

    def send_connection(self, addr: str) -> None:
        """No connection of its own: sends come through ``invoke_raw`` (the frames a real
        connection takes are tested against a broker, tests/integration/test_sdk_producer_cluster.py)."""
        return None

    def invoke_raw(self, addr: str, cmd: RemotingCommand, timeout_ms: int) -> Awaitable[RemotingCommand]:
        return self.invoke(addr, cmd, timeout_ms)

    async def invoke_oneway(self, addr: str, cmd: RemotingCommand) -> None:
        self.oneway.append((addr, cmd))


def _producer(fake: FakeInstance, clock: ManualClock | None = None, **options: int) -> Producer:
    p = Producer("G", namesrv_addrs="127.0.0.1:9876", fault_clock_ms=clock, **options)  # type: ignore[arg-type]
    p._instance = fake  # type: ignore[assignment]
    return p


def _queue_of(cmd: RemotingCommand, addr: str) -> tuple[str, int]:
    broker = next(b for b, a in ADDRS.items() if a == addr)
    return broker, int((cmd.ext_fields or {})["e"])


# --- sharding keys ---------------------------------------------------------------------------------
def test_sharding_key_picks_crc32_of_the_key_modulo_the_queue_count() -> None:
    queues = [MessageQueue("T", "b", i) for i in range(8)]
    for key in ("order-1", "order-42", "ünïcode", ""):
        assert select_by_sharding_key(queues, key) == queues[zlib.crc32(key.encode()) % 8]
    # Fixed values: the choice is the same in every process and every run.
    assert [select_by_sharding_key(queues, k).queue_id for k in ("order-1", "order-2", "order-3")] == [
        zlib.crc32(b"order-1") % 8,
        zlib.crc32(b"order-2") % 8,
        zlib.crc32(b"order-3") % 8,
    ]
    with pytest.raises(errors.IllegalArgumentError):
        select_by_sharding_key([], "k")


def test_sharding_key_choice_does_not_depend_on_the_process_hash_seed() -> None:
    code = (
        "from sdk.producer import select_by_sharding_key; from sdk.message import MessageQueue;"
        "qs=[MessageQueue('T','b',i) for i in range(16)];"
        "print([select_by_sharding_key(qs, f'key-{i}').queue_id for i in range(50)])"
    )
    outputs = {
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True, env={"PYTHONHASHSEED": seed}
        ).stdout
        for seed in ("1", "2", "3")
    }
    assert len(outputs) == 1


@pytest.mark.asyncio
async def test_messages_with_one_sharding_key_all_go_to_one_queue() -> None:
    fake = FakeInstance()
    p = _producer(fake)
    for i in range(20):
        await p.send(Message("T", b"%d" % i), sharding_key="order-7")
    assert len({_queue_of(cmd, addr) for addr, cmd in fake.sent}) == 1
    queues = fake.route.publish_queues
    expected = queues[zlib.crc32(b"order-7") % len(queues)]
    assert _queue_of(fake.sent[0][1], fake.sent[0][0]) == (expected.broker_name, expected.queue_id)


@pytest.mark.asyncio
async def test_a_queue_selector_chooses_the_queue_and_must_return_one_of_the_topics() -> None:
    fake = FakeInstance()
    p = _producer(fake)

    def last(queues: Sequence[MessageQueue], msg: Message) -> MessageQueue:
        return queues[-1]

    result = await p.send(Message("T", b"x"), queue_selector=last)
    assert result.message_queue == MessageQueue("T", "broker-b", 1)
    with pytest.raises(errors.IllegalArgumentError, match="not one of"):
        await p.send(Message("T", b"x"), queue_selector=lambda qs, m: MessageQueue("Other", "b", 0))


# --- retries and fault tolerance ---------------------------------------------------------------------
@pytest.mark.asyncio
async def test_a_failed_send_is_retried_on_another_broker_and_that_broker_is_avoided_afterwards(
    clock: ManualClock,
) -> None:
    fake = FakeInstance(_a_refuses)
    p = _producer(fake, clock)
    p._publish["T"] = (fake.route, TopicPublishQueues(fake.route.publish_queues, start=0))  # starts at broker-a
    result = await p.send(Message("T", b"x"))
    assert result.status is SendStatus.SEND_OK
    assert [a for a, _ in fake.sent] == [ADDRS["broker-a"], ADDRS["broker-b"]]
    ids = {decode_properties((c.ext_fields or {})["i"])["UNIQ_KEY"] for _, c in fake.sent}
    assert ids == {result.msg_id}, "a retry carries the same unique id"
    fake.sent.clear()
    for _ in range(6):
        await p.send(Message("T", b"x"))
    assert {a for a, _ in fake.sent} == {ADDRS["broker-b"]}, "broker-a is isolated after its failure"
    clock.advance(600_000)
    for _ in range(6):
        await p.send(Message("T", b"x"))
    assert ADDRS["broker-a"] in {a for a, _ in fake.sent}, "and comes back once its isolation ends"


@pytest.mark.asyncio
async def test_a_transport_failure_on_the_send_path_is_a_connection_failure_and_retried() -> None:
    """The send path awaits the connection's own future (``invoke_raw``), whose failures are the
    remoting layer's: the producer translates them as ``invoke`` does."""

    class Refusing(FakeInstance):
        def invoke_raw(self, addr: str, cmd: RemotingCommand, timeout_ms: int) -> Awaitable[RemotingCommand]:
            if addr != ADDRS["broker-a"]:
                return self.invoke(addr, cmd, timeout_ms)
            self.sent.append((addr, cmd))
            failed: asyncio.Future[RemotingCommand] = asyncio.get_running_loop().create_future()
            failed.set_exception(RemotingConnectError(addr, "refused"))
            return failed

    fake = Refusing()
    p = _producer(fake)
    p._publish["T"] = (fake.route, TopicPublishQueues(fake.route.publish_queues, start=0))  # starts at broker-a
    result = await p.send(Message("T", b"x"))
    assert result.status is SendStatus.SEND_OK
    assert [a for a, _ in fake.sent] == [ADDRS["broker-a"], ADDRS["broker-b"]]
    queues = (MessageQueue("T", "broker-a", 0),)
    only_a = Refusing(route=TopicRoute("T", queues, queues, {"broker-a": {0: ADDRS["broker-a"]}}))
    with pytest.raises(errors.ConnectionFailedError, match="refused"):
        await _producer(only_a, retry_times=1).send(Message("T", b"x"))
    assert len(only_a.sent) == 2


@pytest.mark.asyncio
async def test_a_new_route_with_the_same_queues_sends_to_its_new_master_and_keeps_the_round_robin() -> None:
    """The send path takes each broker's master from the route its queues came from: a route
    that moves broker-a's master keeps the queues' turn but sends to the new address."""
    fake = FakeInstance()
    p = _producer(fake)
    await p.send(Message("T", b"x"))
    moved = {"broker-a": "10.0.0.9:10911", "broker-b": ADDRS["broker-b"]}
    old = fake.route
    fake.route = TopicRoute("T", old.publish_queues, old.subscribe_queues, {b: {0: a} for b, a in moved.items()})
    for _ in range(4):
        await p.send(Message("T", b"x"))
    queues = list(old.publish_queues)
    picked = [(c.ext_fields or {})["e"] for _, c in fake.sent]
    first = (fake.sent[0][0], int(picked[0]))
    start = next(i for i, q in enumerate(queues) if (ADDRS[q.broker_name], q.queue_id) == first)
    expected = [queues[(start + i) % len(queues)] for i in range(5)]
    assert picked == [str(q.queue_id) for q in expected], "the round robin goes on across the new route"
    assert [a for a, _ in fake.sent[1:]] == [moved[q.broker_name] for q in expected[1:]]
    assert "10.0.0.9:10911" in {a for a, _ in fake.sent[1:]}


@pytest.mark.asyncio
async def test_a_non_retriable_answer_is_raised_at_once() -> None:
    def answer(addr: str, cmd: RemotingCommand) -> RemotingCommand:
        return RemotingCommand(ResponseCode.MESSAGE_ILLEGAL, flag=FLAG_RESPONSE, remark="bad property")

    fake = FakeInstance(answer)
    with pytest.raises(errors.IllegalMessageError, match="bad property"):
        await _producer(fake).send(Message("T", b"x"))
    assert len(fake.sent) == 1


@pytest.mark.asyncio
async def test_retriable_failures_stop_after_retry_times_and_raise_the_last_error() -> None:
    def answer(addr: str, cmd: RemotingCommand) -> RemotingCommand:
        return RemotingCommand(ResponseCode.SYSTEM_BUSY, flag=FLAG_RESPONSE, remark=f"busy {addr}")

    fake = FakeInstance(answer)
    with pytest.raises(errors.SystemBusyError):
        await _producer(fake, retry_times=3).send(Message("T", b"x"))
    assert len(fake.sent) == 4


@pytest.mark.asyncio
async def test_a_topic_error_marks_the_route_stale_and_the_retry_goes_on() -> None:
    calls = 0

    def answer(addr: str, cmd: RemotingCommand) -> RemotingCommand:
        nonlocal calls
        calls += 1
        if calls == 1:
            return RemotingCommand(ResponseCode.TOPIC_NOT_EXIST, flag=FLAG_RESPONSE, remark="gone")
        return _ok(addr, cmd)

    fake = FakeInstance(answer)
    await _producer(fake).send(Message("T", b"x"))
    # (the instance trims the cached route and fetches it again in the background: ClientInstance.route_stale)
    assert [(mq.topic, code) for mq, code in fake.stale] == [("T", ResponseCode.TOPIC_NOT_EXIST)]
    assert len(fake.sent) == 2


@pytest.mark.asyncio
async def test_sends_give_up_when_send_timeout_ms_is_spent() -> None:
    loop = asyncio.get_running_loop()

    def answer(addr: str, cmd: RemotingCommand) -> RemotingCommand:
        raise errors.RequestTimeoutError("slow", addr=addr)

    fake = FakeInstance(answer)
    p = _producer(fake, send_timeout_ms=50, retry_times=1000)
    t0 = loop.time()
    real_invoke = fake.invoke

    async def slow_invoke(addr: str, cmd: RemotingCommand, timeout_ms: int | None = None) -> RemotingCommand:
        assert timeout_ms is not None
        assert timeout_ms <= 50, "each attempt gets what is left of the budget"
        await asyncio.sleep(0.01)
        return await real_invoke(addr, cmd, timeout_ms)

    fake.invoke = slow_invoke  # type: ignore[method-assign]
    with pytest.raises(errors.RequestTimeoutError, match="send_timeout_ms=50"):
        await p.send(Message("T", b"x"))
    assert loop.time() - t0 < 1.0
    assert 2 <= len(fake.sent) <= 10


# --- validation and batches ---------------------------------------------------------------------------
@pytest.mark.asyncio
async def test_an_oversized_message_fails_before_any_request() -> None:
    fake = FakeInstance()
    p = _producer(fake, max_message_bytes=1024)
    with pytest.raises(errors.MessageTooLargeError) as info:
        await p.send(Message("T", b"x" * 1025))
    assert (info.value.size, info.value.max_bytes) == (1025, 1024)
    with pytest.raises(errors.MessageTooLargeError):
        await p.send_batch([Message("T", b"x" * 600), Message("T", b"y" * 600)])
    with pytest.raises(errors.MessageTooLargeError):
        p.send_async(Message("T", b"x" * 2000))
    assert fake.sent == []


def test_the_default_limit_is_four_mebibytes() -> None:
    assert Producer("G", namesrv_addrs="h:1").max_message_bytes == 4 * 1024 * 1024


@pytest.mark.asyncio
async def test_a_batch_holds_one_topic_and_returns_one_id_per_message() -> None:
    fake = FakeInstance()
    p = _producer(fake)
    with pytest.raises(errors.IllegalMessageError, match="one topic"):
        await p.send_batch([Message("T", b"1"), Message("U", b"2")])
    with pytest.raises(errors.IllegalMessageError, match="empty"):
        await p.send_batch([])
    result = await p.send_batch([Message("T", b"1"), Message("T", b"2"), Message("T", b"3")])
    assert len(result.msg_ids) == 3
    assert len(set(result.msg_ids)) == 3
    ((_addr, cmd),) = fake.sent
    assert cmd.code == RequestCode.SEND_BATCH_MESSAGE


@pytest.mark.asyncio
async def test_send_async_returns_a_future_and_runs_the_callback() -> None:
    fake = FakeInstance()
    p = _producer(fake)
    seen: list[SendStatus] = []
    fut = p.send_async(Message("T", b"x"), callback=lambda f: seen.append(f.result().status))
    result = await fut
    await asyncio.sleep(0)
    assert result.status is SendStatus.SEND_OK
    assert seen == [SendStatus.SEND_OK]


class Wired(FakeInstance):
    """A cached route and answers as the connection gives them: a future resolved from the
    loop (``invoke_raw`` on an open connection)."""

    def __init__(self, answer: Answer = _ok) -> None:
        super().__init__(answer)
        self.routes = {"T": self.route}

    def invoke_raw(self, addr: str, cmd: RemotingCommand, timeout_ms: int) -> Awaitable[RemotingCommand]:
        self.sent.append((addr, cmd))
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[RemotingCommand] = loop.create_future()
        try:
            fut.set_result(self.answer(addr, cmd))
        except errors.OrbitError as e:
            fut.set_exception(RemotingConnectError(addr, str(e)))
        return fut


async def _warmed() -> tuple[Wired, Producer]:
    """A producer on a ``Wired`` instance that has sent once (the topic's publish queues cached)."""
    fake = Wired()
    p = _producer(fake)
    await p.send(Message("T", b"warm"))
    fake.sent.clear()
    return fake, p


@pytest.mark.asyncio
async def test_send_async_on_a_known_route_makes_no_task_and_writes_at_once() -> None:
    fake, p = await _warmed()
    seen: list[SendStatus] = []
    tasks_before = len(asyncio.all_tasks())
    futs = [p.send_async(Message("T", b"x"), callback=lambda f: seen.append(f.result().status)) for _ in range(4)]
    assert len(fake.sent) == 4, "each request is written by send_async itself, before any await"
    assert not any(isinstance(f, asyncio.Task) for f in futs)
    assert len(asyncio.all_tasks()) == tasks_before
    results = await asyncio.gather(*futs)
    await asyncio.sleep(0)
    assert [r.status for r in results] == [SendStatus.SEND_OK] * 4
    assert seen == [SendStatus.SEND_OK] * 4
    sent_ids = [decode_properties((c.ext_fields or {})["i"])["UNIQ_KEY"] for _, c in fake.sent]
    assert [r.msg_id for r in results] == sent_ids
    assert [r.message_queue.queue_id for r in results] == [int((c.ext_fields or {})["e"]) for _, c in fake.sent]
    assert len({(r.message_queue.broker_name, r.message_queue.queue_id) for r in results}) == 4, "round robin"
    assert not p._pending, "answered sends no longer count as in flight"


@pytest.mark.asyncio
async def test_a_send_async_cancelled_before_its_answer_stops_counting_as_in_flight() -> None:
    _, p = await _warmed()
    seen: list[bool] = []
    fut = p.send_async(Message("T", b"x"), callback=lambda f: seen.append(f.cancelled()))
    assert fut in p._pending
    fut.cancel()
    for _ in range(100):  # until the answer's callback and the user's have run
        if seen and not p._pending:
            break
        await asyncio.sleep(0)
    assert fut.cancelled()
    assert seen == [True]
    assert not p._pending


@pytest.mark.asyncio
async def test_send_async_retries_a_failed_first_attempt_on_another_broker_with_the_same_id(
    clock: ManualClock,
) -> None:
    fake = Wired(_a_refuses)
    p = _producer(fake, clock)
    p._publish["T"] = (fake.route, TopicPublishQueues(fake.route.publish_queues, start=0, masters=ADDRS))
    result = await p.send_async(Message("T", b"x"))
    assert result.status is SendStatus.SEND_OK
    assert [a for a, _ in fake.sent] == [ADDRS["broker-a"], ADDRS["broker-b"]]
    ids = {decode_properties((c.ext_fields or {})["i"])["UNIQ_KEY"] for _, c in fake.sent}
    assert ids == {result.msg_id}
    fake.sent.clear()
    await asyncio.gather(*(p.send_async(Message("T", b"x")) for _ in range(6)))
    assert {a for a, _ in fake.sent} == {ADDRS["broker-b"]}, "the failed first attempt isolated broker-a"


@pytest.mark.asyncio
async def test_send_async_raises_a_non_retriable_answer_in_its_future_and_shutdown_waits_for_sends() -> None:
    def refused(addr: str, cmd: RemotingCommand) -> RemotingCommand:
        return RemotingCommand(ResponseCode.NO_PERMISSION, flag=FLAG_RESPONSE, remark="no")

    fake, p = await _warmed()
    fake.answer = refused
    fut = p.send_async(Message("T", b"x"))
    with pytest.raises(errors.OrbitError, match="no"):
        await fut
    assert len(fake.sent) == 1, "not retried"
    fake.answer = _ok
    pending = [p.send_async(Message("T", b"x")) for _ in range(3)]
    fake.remove_producer = lambda group: None  # type: ignore[attr-defined]
    fake.closed = True  # type: ignore[attr-defined]

    async def release() -> None:
        return None

    fake.release = release  # type: ignore[attr-defined]
    await p.shutdown()
    assert all(f.done() and f.result().status is SendStatus.SEND_OK for f in pending)


@pytest.mark.asyncio
async def test_send_oneway_asks_for_no_answer() -> None:
    fake = FakeInstance()
    await _producer(fake).send_oneway(Message("T", b"x"), sharding_key="k")
    assert fake.sent == []
    assert len(fake.oneway) == 1
    assert fake.oneway[0][1].code == RequestCode.SEND_MESSAGE_V2


@pytest.mark.asyncio
async def test_a_producer_that_is_not_started_says_so() -> None:
    p = Producer("G", namesrv_addrs="127.0.0.1:1")
    with pytest.raises(errors.ClientStateError, match="not started"):
        await p.send(Message("T", b"x"))
    with pytest.raises(errors.IllegalArgumentError):
        Producer("", namesrv_addrs="h:1")


@pytest.mark.asyncio
async def test_a_refusal_with_a_rate_paces_the_following_sends_and_a_slot_past_the_deadline_fails_unsent() -> None:
    """broker-a refuses the first send with a retry-after and the tenant's rate (20 msgs/s): the
    client's next sends go no faster than that, and one whose slot is past its send timeout
    fails at once without a request."""
    refusals = [1]

    def answer(addr: str, cmd: RemotingCommand) -> RemotingCommand:
        if refusals and refusals.pop():
            return RemotingCommand(
                ResponseCode.FLOW_CONTROL, flag=FLAG_RESPONSE,
                remark="[TOO_MANY_REQUESTS] tenant 't' is over its publish quota on this broker, "
                "retry-after-ms=50, quota-msgs-per-s=20",
            )  # fmt: skip
        return _ok(addr, cmd)

    fake = FakeInstance(answer, route=_route(per_broker=1))
    p = _producer(fake, send_timeout_ms=400)
    loop = asyncio.get_running_loop()
    began = loop.time()
    sent = [await p.send(Message("T", b"x"), queue_selector=lambda qs, m: qs[0]) for _ in range(4)]
    took = loop.time() - began
    assert len(sent) == 4
    # the refused one after 50 ms (+ up to 5 ms of jitter), then a slot every 50 ms (20 msgs/s)
    assert took >= 0.05 + 3 * 0.05 - 0.005, took
    assert len(fake.sent) == 5  # four sends and the one refusal
    # The pace is full for the next ~0.4 s: a burst of sends with a 400 ms timeout finds no slot
    # for most of them, which fail at once with nothing sent.
    results = await asyncio.gather(
        *(p.send(Message("T", b"y"), queue_selector=lambda qs, m: qs[0]) for _ in range(20)), return_exceptions=True
    )
    held = [r for r in results if isinstance(r, errors.FlowControlError)]
    assert held
    assert all(e.local for e in held)
    assert len(fake.sent) == 5 + 20 - len(held)
