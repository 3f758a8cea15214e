"""Streaming write: ``df.writeStream.format("orbit")`` — every micro-batch's rows become messages.

The rows and their mapping are the batch writer's (``writer.py``: ``body`` and the optional
``topic``, ``keys``, ``tags``, ``properties``, ``sharding_key``, ``idempotency_key``); each task
sends its part of the micro-batch with a producer of its own, in SEND_BATCH_MESSAGE batches,
backing off while the tenant is throttled.

Delivery is at least once, as Orbit has no transaction spanning a micro-batch's tasks: a task
retried by Spark, or a micro-batch run again after a restart (its commit had not reached the
checkpoint), sends its rows again. The copies carry the same ``idempotency_key`` property when
the rows have that column — derive it from the data (for a stream read from Orbit:
``concat(topic, ':', broker, ':', queue_id, ':', queue_offset)`` is stable across replays) and
consumers can drop the duplicates.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pyspark.sql.datasource import DataSourceStreamWriter, WriterCommitMessage

from spark_integration.options import WriteOptions
from spark_integration.writer import WriteResult, log_abort, log_commit, write_partition


class OrbitStreamWriter(DataSourceStreamWriter):
    def __init__(self, opts: WriteOptions) -> None:
        self.opts = opts

    def write(self, iterator: Iterator[Any]) -> WriteResult:
        return write_partition(self.opts, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log_commit(f"orbit stream write of micro-batch {batchId}", messages)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log_abort(f"orbit stream write of micro-batch {batchId}", messages)
