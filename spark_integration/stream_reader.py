"""Streaming read: ``spark.readStream.format("orbit")`` as Structured Streaming micro-batches.

The stream's offset is every queue's next consume offset (``offsets.py``). Spark drives it:

    initialOffset()              startingOffsets / startingTimestamp resolved per queue (first start only;
                                 a restart resumes from the offsets in the checkpoint instead)
    latestOffset(start, limit)   each queue's max offset now — capped by the trigger's limit
                                 (``maxMessagesPerTrigger`` → ``ReadMaxRows``) and, under
                                 ``Trigger.AvailableNow``, by the max offsets seen when the query started
    partitions(start, end)       one ``OffsetRange`` per queue with something new (split by
                                 ``maxRecordsPerPartition``); a start that retention deleted fails the
                                 batch (``failOnDataLoss=true``) or moves to the queue's first message
    read(partition)              on an executor: PULL_MESSAGE of that fixed range (``batch_reader``)
    commit(end)                  optionally UPDATE_CONSUMER_OFFSET of ``commitToGroup`` to ``end`` (also
                                 done for latestOffset's start: see ``_commit_group``)

Exactly-once output rests on Spark: the range of batch N is written to the checkpoint's offset
log before it runs, a restart re-plans an unfinished batch from the same offsets, and an
offset range always reads the same messages (offsets of a queue never change). Nothing is
skipped on restart, except what retention deleted, and that only with ``failOnDataLoss=false``.

This object lives in the query's planner process on the driver for the whole query (its client
and the AvailableNow target stay between calls); executors get a pickled copy without them.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import Any

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow

from data_plane.remoting.codes import RequestCode
from sdk import protocol
from sdk.message import MessageQueue
from spark_integration import offsets
from spark_integration.batch_reader import (
    OffsetRange,
    QueueBounds,
    queue_bounds,
    queue_offset,
    read_rows,
    resolve_offset,
    split,
)
from spark_integration.client import TaskClient
from spark_integration.errors import OrbitSparkError
from spark_integration.offsets import Offsets, QueueKey
from spark_integration.options import ReadOptions

log = logging.getLogger(__name__)


def _key(mq: MessageQueue) -> QueueKey:
    return (mq.topic, mq.broker_name, mq.queue_id)


class OrbitStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, opts: ReadOptions) -> None:
        self.opts = opts
        self._client: TaskClient | None = None
        self._available_now: Offsets | None = None  # the end of a Trigger.AvailableNow query
        self._group_committed: Offsets | None = None  # what commitToGroup holds now

    def __getstate__(self) -> dict[str, Any]:
        # Executors only call read(): they get the options, not the driver's client.
        return {"opts": self.opts, "_client": None, "_available_now": None, "_group_committed": None}

    def _c(self) -> TaskClient:
        if self._client is None:
            o = self.opts
            client = TaskClient(o.namesrv, o.credentials, request_timeout_ms=o.request_timeout_ms)
            try:
                client.run(client.check_credentials())
            except BaseException:
                client.close()
                raise
            self._client = client
        return self._client

    def _bounds(self) -> list[QueueBounds]:
        c = self._c()
        return c.run(queue_bounds(c, self.opts))

    # --- where to start, where a batch ends -------------------------------------------------------
    def initialOffset(self) -> dict[str, Any]:
        c = self._c()
        o = self.opts

        async def resolve() -> Offsets:
            out: Offsets = {}
            for q in await queue_bounds(c, o):
                out[_key(q.mq)] = await resolve_offset(
                    c, q.addr, q.mq, o.starting, q.lo, q.hi, "startingOffsets", o.fail_on_data_loss
                )
            return out

        return offsets.to_json(c.run(resolve()))

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.opts.max_messages_per_trigger
        return ReadMaxRows(n) if n is not None else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        """Trigger.AvailableNow: read up to the max offsets of this moment, in as many batches
        as ``maxMessagesPerTrigger`` makes, then stop."""
        self._available_now = {_key(q.mq): q.hi for q in self._bounds()}

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        begin = offsets.from_json(start, "the checkpointed start offset")
        self._commit_group(begin)
        end: Offsets = dict(begin)  # a queue that vanished from the route keeps its place
        for q in self._bounds():
            k = _key(q.mq)
            # A queue (or a topic matching topicPattern) new since the start: from its first message.
            s = begin.setdefault(k, q.lo)
            target = q.hi
            if self._available_now is not None:
                target = min(target, self._available_now.get(k, s))
            if not self.opts.fail_on_data_loss:
                s = max(s, q.lo)  # deleted offsets are skipped: they take no room in the limit
                begin[k] = s
            end[k] = max(s, target)
        if isinstance(limit, ReadMaxRows):
            end = offsets.cap(begin, end, limit.max_rows)
        given = offsets.from_json(start)
        for k, e in end.items():  # never behind the start Spark gave (skipping happens in partitions)
            end[k] = max(e, given.get(k, 0))
        return offsets.to_json(end)

    # --- planning and reading a batch -------------------------------------------------------------
    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        begin = offsets.from_json(start, "the batch's start offset")
        stop = offsets.from_json(end, "the batch's end offset")
        c = self._c()
        ranges: list[OffsetRange] = []
        for k in sorted(stop):
            e = stop[k]
            s = begin.get(k)
            if s is not None and e <= s:
                continue
            topic, broker, queue_id = k
            mq = MessageQueue(topic, broker, queue_id)
            addr = c.run(c.instance.broker_addr(mq, master_only=True))
            lo = c.run(queue_offset(c, addr, RequestCode.GET_MIN_OFFSET, mq))
            if s is None:  # a queue (or topic) new since the batch's start: from its first message
                s = lo
            elif s < lo:
                s = self._lost(k, s, e, lo)
            if s < e:
                ranges.extend(split(OffsetRange(topic, broker, queue_id, s, e), self.opts.max_records_per_partition))
        return ranges

    def _lost(self, key: QueueKey, start: int, end: int, lo: int) -> int:
        """Retention deleted offsets ``[start, lo)`` that this batch should read."""
        what = (
            f"{offsets.describe(key)}: the query's checkpoint needs offsets {start}..{end - 1} but retention "
            f"deleted the messages before offset {lo}"
        )
        if self.opts.fail_on_data_loss:
            raise OrbitSparkError(
                f"{what} (lost {lo - start} messages). Set failOnDataLoss=false to skip them and go on."
            )
        log.warning("%s: skipping %d lost messages (failOnDataLoss=false)", what, min(lo, end) - start)
        return min(lo, end)

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        return read_rows(self.opts, partition)

    # --- progress ---------------------------------------------------------------------------------
    def commit(self, end: dict[str, Any]) -> None:
        """Spark finished every batch up to ``end``."""
        self._commit_group(offsets.from_json(end))

    def _commit_group(self, done: Offsets) -> None:
        """With ``commitToGroup``, move the group's offsets to ``done``, for ``orbit group
        progress`` and lag alerts. Called from ``commit`` and from ``latestOffset``, whose start
        Spark passes only once the batch ending there is in the sink: Spark calls ``commit`` for a
        batch only when it plans the next one, so a Trigger.AvailableNow query's last batch would
        otherwise show as lag. Spark never reads these offsets back (its checkpoint is the
        truth), so a refused commit is logged, not fatal."""
        group = self.opts.commit_to_group
        if group is None or not done or done == self._group_committed:
            return
        c = self._c()

        async def commit_all() -> None:
            for (topic, broker, queue_id), offset in done.items():
                mq = MessageQueue(topic, broker, queue_id)
                addr = await c.instance.broker_addr(mq, master_only=True)
                resp = await c.instance.invoke(addr, protocol.update_offset_request(group, mq, offset))
                protocol.check(resp, addr)

        try:
            c.run(commit_all())
            self._group_committed = dict(done)
        except Exception as e:
            log.warning("committing the stream's offsets to group %r failed (the query goes on): %s", group, e)

    def stop(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
