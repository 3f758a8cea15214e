"""Batch write: each Spark task sends its rows as messages with its own producer, in batches.

Rows: ``body`` (binary or string, required) and optionally ``topic`` (else the ``topic``
option), ``keys`` (string or array of strings), ``tags``, ``properties`` (map of strings),
``sharding_key`` (same key → same queue, in row order) and ``idempotency_key`` (stored as the
``idempotency_key`` property, for consumers to de-duplicate). Columns that a read produces
(``queue_id``, ``msg_id``, ...) are ignored, so a read DataFrame can be written back as is.

Rows are grouped by (topic, sharding key) into SEND_BATCH_MESSAGE requests of up to
``batchSize`` messages (and about 1 MiB). A tenant over its quota (FLOW_CONTROL) or a busy
broker stored nothing: the task waits (the broker's retry hint, growing to 5 s) and sends
again, for up to ``throttleTimeoutMs`` per batch, instead of failing the job.

Semantics: at least once. A batch is acknowledged before the next one is sent; a task that
fails after some batches were stored is retried by Spark from its first row, so those are
stored again (with new message ids). Give rows an ``idempotency_key`` that is derived from the
data to let consumers drop the copies. ``abort`` cannot take back what tasks already stored.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSourceWriter, WriterCommitMessage
from pyspark.sql.types import ArrayType, BinaryType, DataType, MapType, StringType, StructType

from sdk.errors import FlowControlError, SystemBusyError
from sdk.message import Message
from sdk.producer import Producer
from spark_integration.client import TaskClient, translate
from spark_integration.errors import OrbitSparkError
from spark_integration.options import WriteOptions

log = logging.getLogger(__name__)

IDEMPOTENCY_PROPERTY = "idempotency_key"
MAX_BATCH_BYTES = 1024 * 1024
READ_ONLY_COLUMNS = frozenset({"queue_id", "queue_offset", "msg_id", "born_timestamp", "store_timestamp", "broker"})
_TYPES: dict[str, tuple[type[DataType], ...]] = {
    "body": (BinaryType, StringType),
    "topic": (StringType,),
    "keys": (StringType, ArrayType),
    "tags": (StringType,),
    "properties": (MapType,),
    "sharding_key": (StringType,),
    "idempotency_key": (StringType,),
}


def check_schema(schema: StructType, opts: WriteOptions) -> None:
    names = {f.name for f in schema.fields}
    if "body" not in names:
        raise OrbitSparkError(
            f"writing to Orbit needs a 'body' column (binary or string); the columns are {sorted(names)}"
        )
    for f in schema.fields:
        if f.name in READ_ONLY_COLUMNS:
            continue
        allowed = _TYPES.get(f.name)
        if allowed is None:
            raise OrbitSparkError(
                f"column {f.name!r} has no meaning for Orbit; use body, topic, keys, tags, properties, "
                "sharding_key, idempotency_key (drop or rename the others)"
            )
        if not isinstance(f.dataType, allowed):
            raise OrbitSparkError(f"column {f.name!r} cannot be {f.dataType.simpleString()}")
    if opts.topic is None and "topic" not in names:
        raise OrbitSparkError("say where to write: the option topic, or a 'topic' column")


@dataclass(frozen=True)
class WriteResult(WriterCommitMessage):
    partition_id: int
    messages: int
    batches: int
    throttled_waits: int


def to_message(row: Mapping[str, Any], default_topic: str | None) -> tuple[Message, str | None]:
    topic = row.get("topic") or default_topic
    if not topic:
        raise OrbitSparkError("a row has no topic (null 'topic' column and no topic option)")
    body = row.get("body")
    if body is None:
        raise OrbitSparkError(f"a row for topic {topic!r} has a null body")
    if isinstance(body, str):
        body = body.encode()
    keys = row.get("keys")
    if isinstance(keys, str):
        keys = [k for k in keys.split(" ") if k]
    props = dict(row.get("properties") or {})
    idem = row.get("idempotency_key")
    if idem is not None:
        props[IDEMPOTENCY_PROPERTY] = str(idem)
    msg = Message(topic, bytes(body), tags=row.get("tags") or None, keys=keys or (), properties=props)
    return msg, row.get("sharding_key")


class _Sender:
    def __init__(self, client: TaskClient, producer: Producer, opts: WriteOptions) -> None:
        self.client = client
        self.producer = producer
        self.opts = opts
        self.messages = 0
        self.batches = 0
        self.throttled_waits = 0

    def send(self, msgs: list[Message], sharding_key: str | None) -> None:
        deadline = time.monotonic() + self.opts.throttle_timeout_ms / 1000
        backoff_s = 0.1
        while True:
            try:
                self.client.run(self.producer.send_batch(msgs, sharding_key=sharding_key))
                break
            except (FlowControlError, SystemBusyError) as e:
                hint_s = e.retry_after_ms / 1000 if isinstance(e, FlowControlError) else 0.0
                wait_s = min(max(hint_s, backoff_s), 5.0)
                if time.monotonic() + wait_s > deadline:
                    raise OrbitSparkError(
                        f"Orbit kept throttling writes to {msgs[0].topic!r} for throttleTimeoutMs="
                        f"{self.opts.throttle_timeout_ms}: {e}"
                    ) from None
                self.throttled_waits += 1
                time.sleep(wait_s)
                backoff_s = min(backoff_s * 2, 5.0)
        self.messages += len(msgs)
        self.batches += 1


def write_partition(opts: WriteOptions, iterator: Iterator[Any]) -> WriteResult:
    """Send one Spark task's rows (batch or micro-batch) with a producer of the task's own."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    partition_id = ctx.partitionId() if ctx is not None else -1
    with TaskClient(opts.namesrv, opts.credentials, request_timeout_ms=opts.request_timeout_ms) as client:
        producer = Producer(
            opts.producer_group,
            namesrv_addrs=list(opts.namesrv),
            credentials=client.credentials,
            tls=client.tls,
            send_timeout_ms=opts.send_timeout_ms,
            instance_name=f"orbit-spark-{partition_id}",
        )
        client.run(producer.start())
        try:
            sender = _Sender(client, producer, opts)
            pending: dict[tuple[str, str | None], tuple[list[Message], int]] = {}
            for row in iterator:
                msg, key = to_message(row.asDict(), opts.topic)
                group = (msg.topic, key)
                batch, size = pending.get(group, ([], 0))
                if batch and (len(batch) >= opts.batch_size or size + len(msg.body) > MAX_BATCH_BYTES):
                    sender.send(batch, key)
                    batch, size = [], 0
                batch.append(msg)
                pending[group] = (batch, size + len(msg.body))
            for (_, key), (batch, _) in pending.items():
                if batch:
                    sender.send(batch, key)
        except Exception as e:
            err = translate(e, opts.credentials)
            if err is e:
                raise
            raise err from None
        finally:
            client.run(producer.shutdown())
    return WriteResult(partition_id, sender.messages, sender.batches, sender.throttled_waits)


class OrbitBatchWriter(DataSourceWriter):
    def __init__(self, opts: WriteOptions) -> None:
        self.opts = opts

    def write(self, iterator: Iterator[Any]) -> WriteResult:
        return write_partition(self.opts, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        log_commit("orbit write", messages)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        log_abort("orbit write", messages)


def log_commit(what: str, messages: list[WriterCommitMessage | None]) -> None:
    done = [m for m in messages if isinstance(m, WriteResult)]
    log.info(
        "%s committed: %d messages in %d batches from %d tasks (%d throttled waits)",
        what,
        sum(m.messages for m in done),
        sum(m.batches for m in done),
        len(done),
        sum(m.throttled_waits for m in done),
    )


def log_abort(what: str, messages: list[WriterCommitMessage | None]) -> None:
    stored = sum(m.messages for m in messages if isinstance(m, WriteResult))
    log.warning("%s aborted: %d messages already stored by successful tasks stay stored (at-least-once)", what, stored)
