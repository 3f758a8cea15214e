"""Batch read: plan Spark partitions from the cluster's queue offsets, read each partition's
offset range with PULL_MESSAGE.

Planning (on the driver) resolves the topics (``topic`` / ``topics`` / ``topicPattern`` over
the name servers' topic list), asks each queue's broker for its min and max offset (and, for
timestamps, SEARCH_OFFSET_BY_TIMESTAMP), and makes one ``OffsetRange`` partition per queue —
split into pieces of at most ``maxRecordsPerPartition`` messages when that option is set. The
ranges are fixed at planning time, so a task retried by Spark reads exactly the same messages.

Reading (on an executor) pulls ``[start, end)`` of one queue from the queue's master without
long polling, and turns each message into a row of ``SCHEMA``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pyspark.sql.datasource import DataSourceReader, InputPartition
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from data_plane.remoting import bodies
from data_plane.remoting.codes import RequestCode
from data_plane.remoting.command import RemotingCommand
from sdk import protocol
from sdk.errors import OrbitError
from sdk.message import SYSTEM_PROPERTIES, MessageExt, MessageQueue
from sdk.protocol import PullStatus
from spark_integration.client import TaskClient
from spark_integration.errors import OrbitSparkError
from spark_integration.options import EARLIEST, LATEST, OffsetSpec, ReadOptions

SCHEMA = StructType(
    [
        StructField("topic", StringType(), False),
        StructField("queue_id", IntegerType(), False),
        StructField("queue_offset", LongType(), False),
        StructField("msg_id", StringType(), False),
        StructField("keys", ArrayType(StringType(), False), False),
        StructField("tags", StringType(), True),
        StructField("properties", MapType(StringType(), StringType(), False), False),
        StructField("body", BinaryType(), False),
        StructField("born_timestamp", TimestampType(), False),
        StructField("store_timestamp", TimestampType(), False),
        StructField("broker", StringType(), False),
    ]
)

# Topics the cluster keeps for itself: never matched by topicPattern.
_SYSTEM_TOPIC = re.compile(
    r"(%RETRY%|%DLQ%|rmq_sys_|RMQ_SYS_|TBW102$|SCHEDULE_TOPIC_XXXX$|TRANS_|OFFSET_MOVED_EVENT$|SELF_TEST_TOPIC$)"
)
DEFAULT_GROUP = "orbit-spark-reader"


@dataclass(frozen=True)
class OffsetRange(InputPartition):
    """Messages ``[start, end)`` of one queue; ``end == start`` is an empty range."""

    topic: str
    broker: str
    queue_id: int
    start: int
    end: int

    @property
    def count(self) -> int:
        return self.end - self.start


def _ms_to_datetime(ms: int) -> datetime:
    seconds, millis = divmod(ms, 1000)
    return datetime.fromtimestamp(seconds, UTC).replace(microsecond=millis * 1000)


def to_row(m: MessageExt) -> tuple[Any, ...]:
    props = {k: v for k, v in m.properties.items() if k not in SYSTEM_PROPERTIES}
    return (
        m.topic,
        m.queue_id,
        m.queue_offset,
        m.msg_id,
        list(m.keys),
        m.tags,
        props,
        m.body,
        _ms_to_datetime(m.born_timestamp_ms),
        _ms_to_datetime(m.store_timestamp_ms),
        m.broker_name,
    )


def consumer_group(opts: ReadOptions, topic: str) -> str:
    """The group pulls are made as: the option, else ``orbit-spark-reader`` in the topic's
    namespace (``tenant%orbit-spark-reader`` for ``tenant%topic``). Nothing is committed."""
    if opts.consumer_group:
        return opts.consumer_group
    ns, sep, _ = topic.partition("%")
    return f"{ns}%{DEFAULT_GROUP}" if sep else DEFAULT_GROUP


# --- planning ---------------------------------------------------------------------------------------
async def topics_of(client: TaskClient, opts: ReadOptions) -> list[str]:
    if opts.topic_pattern is None:
        return list(opts.topics)
    inst = client.instance
    addr, resp = await inst.invoke_namesrv(RemotingCommand(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER))
    protocol.check(resp, addr)
    names = bodies.loads_object(resp.body_bytes()).get("topicList") or []
    rx = re.compile(opts.topic_pattern)
    found = sorted(t for t in names if rx.fullmatch(t) and not _SYSTEM_TOPIC.match(t))
    if not found:
        raise OrbitSparkError(f"no topic matches topicPattern {opts.topic_pattern!r}")
    return found


async def queue_offset(client: TaskClient, addr: str, code: int, mq: MessageQueue) -> int:
    resp = await client.instance.invoke(addr, protocol.queue_offset_request(code, mq))
    return protocol.parse_offset_response(resp, addr)


async def resolve_offset(
    client: TaskClient, addr: str, mq: MessageQueue, spec: OffsetSpec, lo: int, hi: int, what: str, strict: bool
) -> int:
    if spec.kind == "timestamp":
        assert spec.timestamp_ms is not None
        resp = await client.instance.invoke(addr, protocol.search_offset_request(mq, spec.timestamp_ms))
        return min(max(protocol.parse_offset_response(resp, addr), lo), hi)
    off = spec.for_queue(mq.topic, mq.broker_name, mq.queue_id)
    if off == EARLIEST:
        return lo
    if off == LATEST or off is None:
        return hi
    if off > hi:
        raise OrbitSparkError(f"{what} offset {off} of {mq} is past the queue's end ({hi})")
    if off < lo:
        if strict:
            raise OrbitSparkError(
                f"{what} offset {off} of {mq} is before the queue's first message ({lo}): those messages are "
                "gone. Set failOnDataLoss=false to start at the first message still stored."
            )
        return lo
    return off


@dataclass(frozen=True)
class QueueBounds:
    """A readable queue, the address of its master, and its first and next offsets right now."""

    mq: MessageQueue
    addr: str
    lo: int
    hi: int


async def queue_bounds(client: TaskClient, opts: ReadOptions) -> list[QueueBounds]:
    """Every readable queue of the topics the options name, with its min and max offset; a
    JSON ``startingOffsets`` / ``endingOffsets`` naming a queue the topic lacks is an error."""
    found: list[QueueBounds] = []
    for topic in await topics_of(client, opts):
        try:
            route = await client.instance.route(topic, refresh=True)
        except OrbitError as e:
            raise OrbitSparkError(f"topic {topic!r} cannot be read: {e}") from None
        queues = route.subscribe_queues
        if not queues:
            raise OrbitSparkError(f"topic {topic!r} has no readable queue")
        known = {(mq.broker_name, mq.queue_id) for mq in queues}
        for spec, what in ((opts.starting, "startingOffsets"), (opts.ending, "endingOffsets")):
            unknown = sorted(set(spec.offsets.get(topic, {})) - known)
            if unknown:
                names = ", ".join(f"{b}:{q}" for b, q in unknown)
                raise OrbitSparkError(f"{what} names queues topic {topic!r} does not have: {names}")
        for mq in queues:
            addr = await client.instance.broker_addr(mq, master_only=True)
            lo = await queue_offset(client, addr, RequestCode.GET_MIN_OFFSET, mq)
            hi = await queue_offset(client, addr, RequestCode.GET_MAX_OFFSET, mq)
            found.append(QueueBounds(mq, addr, lo, hi))
    return found


async def plan(client: TaskClient, opts: ReadOptions) -> list[OffsetRange]:
    ranges: list[OffsetRange] = []
    strict = opts.fail_on_data_loss
    for q in await queue_bounds(client, opts):
        mq = q.mq
        start = await resolve_offset(client, q.addr, mq, opts.starting, q.lo, q.hi, "startingOffsets", strict)
        end = await resolve_offset(client, q.addr, mq, opts.ending, q.lo, q.hi, "endingOffsets", strict)
        if end < start:
            if opts.starting.kind == "offsets" and opts.ending.kind == "offsets":
                raise OrbitSparkError(f"{mq}: the starting offset {start} is after the ending offset {end}")
            end = start  # e.g. a timestamp window with nothing in it
        ranges.extend(
            split(OffsetRange(mq.topic, mq.broker_name, mq.queue_id, start, end), opts.max_records_per_partition)
        )
    return ranges


def split(r: OffsetRange, max_records: int | None) -> list[OffsetRange]:
    if not max_records or r.count <= max_records:
        return [r]
    return [
        OffsetRange(r.topic, r.broker, r.queue_id, s, min(s + max_records, r.end))
        for s in range(r.start, r.end, max_records)
    ]


# --- reading ----------------------------------------------------------------------------------------
def read_range(client: TaskClient, opts: ReadOptions, r: OffsetRange) -> Iterator[MessageExt]:
    """The messages of ``r`` in offset order (pulled in batches of ``pullBatchSize``)."""
    mq = MessageQueue(r.topic, r.broker, r.queue_id)
    group = consumer_group(opts, r.topic)
    offset = r.start
    while offset < r.end:
        result = client.run(_pull(client, mq, group, offset, min(opts.pull_batch_size, r.end - offset)))
        if result.status is PullStatus.FOUND:
            got = [m for m in result.messages if offset <= m.queue_offset < r.end]
            yield from got
            nxt = max(result.next_begin_offset, got[-1].queue_offset + 1 if got else offset)
        elif result.status is PullStatus.NO_MATCHED_MSG:
            nxt = result.next_begin_offset
        elif result.status is PullStatus.OFFSET_ILLEGAL:
            if offset < result.min_offset and opts.fail_on_data_loss:
                raise OrbitSparkError(
                    f"{mq}: messages from offset {offset} are gone (the queue now starts at {result.min_offset}); "
                    "set failOnDataLoss=false to skip them"
                )
            nxt = result.next_begin_offset
        else:  # NO_NEW_MSG: the range was planned from the queue's max offset, so this is a loss
            if opts.fail_on_data_loss:
                raise OrbitSparkError(
                    f"{mq}: no message at offset {offset} although the planned range ends at {r.end} "
                    f"(queue min {result.min_offset}, max {result.max_offset})"
                )
            return
        if nxt <= offset:
            raise OrbitSparkError(f"{mq}: the broker did not move past offset {offset}")
        offset = nxt


async def _pull(client: TaskClient, mq: MessageQueue, group: str, offset: int, n: int) -> protocol.PullResult:
    inst = client.instance
    addr = await inst.broker_addr(mq, master_only=True)
    cmd = protocol.pull_request(
        group=group, mq=mq, offset=offset, max_nums=n, subscription="*", sub_version=0,
        suspend_timeout_ms=0, suspend=False,
    )  # fmt: skip
    resp = await inst.invoke(addr, cmd)
    return protocol.parse_pull_response(resp, mq.broker_name, addr)


class OrbitBatchReader(DataSourceReader):
    def __init__(self, opts: ReadOptions) -> None:
        self.opts = opts

    def partitions(self) -> Sequence[InputPartition]:
        with TaskClient(self.opts.namesrv, self.opts.credentials, request_timeout_ms=self.opts.request_timeout_ms) as c:
            c.run(c.check_credentials())
            return c.run(plan(c, self.opts))

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        return read_rows(self.opts, partition)


def read_rows(opts: ReadOptions, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
    """The rows of one planned range, with a client of the task's own (batch and streaming)."""
    assert isinstance(partition, OffsetRange)
    if partition.count <= 0:
        return
    with TaskClient(opts.namesrv, opts.credentials, request_timeout_ms=opts.request_timeout_ms) as c:
        for m in read_range(c, opts, partition):
            yield to_row(m)
