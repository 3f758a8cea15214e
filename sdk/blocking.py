"""A blocking facade over the asyncio SDK, for scripts and Spark executors (no event loop there).

Each object runs its own event loop on a background daemon thread and forwards every call to
it, waiting for the answer; errors are the SDK's own (``OrbitError``). Use them as context
managers, or call ``close()``::

    with BlockingProducer("etl", namesrv_addrs="127.0.0.1:9876") as producer:
        producer.send(Message("events", b"..."))

    with BlockingPullConsumer("etl", namesrv_addrs="127.0.0.1:9876") as consumer:   # starts here
        ...

A ``BlockingPullConsumer`` is configured with ``subscribe``/``assign`` before it starts
(``start()``, or entering the ``with`` block); the queues to ``assign`` can be looked up before
that with ``fetch_queues``. Objects are safe to call from several threads (calls are serialized
by the loop), but a consumer's ``poll``s are meant for one thread.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, TypeVar, Unpack

from sdk.client_instance import acquire_instance
from sdk.consumer import ConsumerOptions
from sdk.errors import ClientStateError
from sdk.message import Message, MessageExt, MessageQueue, SendResult
from sdk.producer import Producer, ProducerOptions, QueueSelector
from sdk.pull_consumer import PullConsumer
from sdk.subscription import MessageSelector

T = TypeVar("T")


class _LoopThread:
    """An event loop running forever on a daemon thread."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
        if self.loop.is_closed():
            coro.close()
            raise ClientStateError("closed")
        if threading.current_thread() is self._thread:
            coro.close()
            raise ClientStateError("a blocking call from the SDK's own loop thread would deadlock")
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def stop(self) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


class BlockingProducer:
    """``Producer`` with blocking calls; started on construction."""

    def __init__(self, group: str = "DEFAULT_PRODUCER", **options: Unpack[ProducerOptions]) -> None:
        self._thread = _LoopThread(f"orbit-producer-{group}")
        self._producer = Producer(group, **options)
        try:
            self._thread.run(self._producer.start())
        except BaseException:
            self._thread.stop()
            raise

    @property
    def producer(self) -> Producer:
        return self._producer

    def send(
        self, msg: Message, *, sharding_key: str | None = None, queue_selector: QueueSelector | None = None
    ) -> SendResult:
        return self._thread.run(self._producer.send(msg, sharding_key=sharding_key, queue_selector=queue_selector))

    def send_batch(
        self,
        msgs: Sequence[Message],
        *,
        sharding_key: str | None = None,
        queue_selector: QueueSelector | None = None,
    ) -> SendResult:
        return self._thread.run(
            self._producer.send_batch(msgs, sharding_key=sharding_key, queue_selector=queue_selector)
        )

    def send_oneway(self, msg: Message, *, sharding_key: str | None = None) -> None:
        self._thread.run(self._producer.send_oneway(msg, sharding_key=sharding_key))

    def fetch_publish_queues(self, topic: str) -> list[MessageQueue]:
        return self._thread.run(self._producer.fetch_publish_queues(topic))

    def create_topic(self, topic: str, *, queue_nums: int = 4) -> list[str]:
        return self._thread.run(self._producer.create_topic(topic, queue_nums=queue_nums))

    def close(self) -> None:
        if self._thread.loop.is_closed():
            return
        try:
            self._thread.run(self._producer.shutdown())
        finally:
            self._thread.stop()

    def __enter__(self) -> BlockingProducer:
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


class BlockingPullConsumer:
    """``PullConsumer`` with blocking calls. Configure, then ``start()`` (or enter ``with``)."""

    def __init__(
        self,
        group: str,
        *,
        enable_auto_commit: bool = False,
        auto_commit_interval_ms: int = 5000,
        **options: Unpack[ConsumerOptions],
    ) -> None:
        self._thread = _LoopThread(f"orbit-consumer-{group}")
        self._consumer = PullConsumer(
            group, enable_auto_commit=enable_auto_commit, auto_commit_interval_ms=auto_commit_interval_ms, **options
        )
        self._started = False

    @property
    def consumer(self) -> PullConsumer:
        return self._consumer

    def subscribe(self, topic: str, expression: str | MessageSelector = "*", *, sql: str | None = None) -> None:
        self._consumer.subscribe(topic, expression, sql=sql)

    def assign(self, queues: Iterable[MessageQueue]) -> None:
        qs = list(queues)

        async def assign() -> None:
            self._consumer.assign(qs)

        self._thread.run(assign())

    def fetch_queues(self, topic: str) -> list[MessageQueue]:
        """The topic's readable queues (works before ``start``)."""
        if self._started:
            return self._thread.run(self._consumer.fetch_queues(topic))

        async def lookup() -> list[MessageQueue]:
            c = self._consumer
            inst = await acquire_instance(c.namesrv_addrs, instance_name=c.instance_name, credentials=c.credentials)
            try:
                return list((await inst.route(topic, refresh=True)).subscribe_queues)
            finally:
                await inst.release()

        return self._thread.run(lookup())

    def start(self) -> None:
        if not self._started:
            self._thread.run(self._consumer.start())
            self._started = True

    def poll(self, timeout_ms: int = 5000) -> list[MessageExt]:
        return self._thread.run(self._consumer.poll(timeout_ms))

    def commit(self, offsets: Mapping[MessageQueue, int] | None = None) -> dict[MessageQueue, int]:
        return self._thread.run(self._consumer.commit(offsets))

    def committed(self, mq: MessageQueue) -> int | None:
        return self._thread.run(self._consumer.committed(mq))

    def position(self, mq: MessageQueue) -> int | None:
        async def position() -> int | None:
            return self._consumer.position(mq)

        return self._thread.run(position())

    def seek(self, mq: MessageQueue, offset: int) -> None:
        async def seek() -> None:
            self._consumer.seek(mq, offset)

        self._thread.run(seek())

    def seek_to_timestamp(self, mq: MessageQueue, timestamp_ms: int) -> int:
        return self._thread.run(self._consumer.seek_to_timestamp(mq, timestamp_ms))

    def assignment(self) -> set[MessageQueue]:
        async def assignment() -> set[MessageQueue]:
            return self._consumer.assignment()

        return self._thread.run(assignment())

    def close(self) -> None:
        if self._thread.loop.is_closed():
            return
        try:
            self._thread.run(self._consumer.shutdown())
        finally:
            self._thread.stop()

    def __enter__(self) -> BlockingPullConsumer:
        self.start()
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.close()
