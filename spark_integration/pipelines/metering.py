"""The usage-metering pipeline: brokers' usage records → billing aggregates in PostgreSQL.

    brokers (usage_topic_enabled) ─▶ ORBIT_SYS_USAGE ─▶ readStream.format("orbit")
        ─▶ from_json(body) ─▶ foreachBatch: BillingStore transaction
              applied offsets ─▶ drop records below them ─▶ aggregate per (tenant, minute, broker)
              and per (tenant, hour) (Spark) ─▶ upsert billing_usage_minute / billing_usage_hour
              and billing_pipeline_offsets ─▶ COMMIT

Exactly once across restarts: a record is counted by the transaction that moves its queue's
applied offset past it, and only by that one (billing_store.py). Spark's checkpoint decides what
a micro-batch reads; PostgreSQL decides what is counted — so a micro-batch run again after a
crash, or a query started afresh with an empty checkpoint over the same topic, adds nothing
twice. A record that does not parse (it cannot come from a broker) is logged with its position
and skipped, so one bad message cannot stop billing.

Run it with ``orbit pipeline metering --namesrv HOST:PORT --database-url URL --checkpoint DIR``
(docs/spark.md#the-usage-metering-pipeline).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.query import StreamingQuery
from pyspark.sql.types import LongType, StringType, StructField, StructType

from data_plane.tenancy.usage_topic import USAGE_TOPIC
from spark_integration.errors import OrbitSparkError
from spark_integration.pipelines.billing_store import BillingStore, HourRow, MinuteRow, QueuePosition

log = logging.getLogger(__name__)

MINUTE_MS = 60_000
HOUR_MS = 3_600_000

# A usage record as the broker writes it (data_plane.tenancy.metering.UsageRecord).
RECORD_SCHEMA = StructType(
    [
        StructField("report_id", StringType()),
        StructField("broker", StringType()),
        StructField("tenant", StringType()),
        StructField("minute", LongType()),
        StructField("requests_4k", LongType()),
        StructField("bytes_in", LongType()),
        StructField("bytes_out", LongType()),
        StructField("stored_bytes", LongType()),
        StructField("tiered_bytes", LongType()),  # only in records of brokers with a tier, when not 0
        StructField("messages_in", LongType()),  # these three: only when not 0
        StructField("messages_out", LongType()),
        StructField("throttled_requests", LongType()),
    ]
)
_COUNTERS = ("requests_4k", "bytes_in", "bytes_out")
# Counters a record carries only when not 0 (a record without one counts 0).
_SPARSE_COUNTERS = ("messages_in", "messages_out", "throttled_requests")


@dataclass(frozen=True)
class MeteringOptions:
    """What ``orbit pipeline metering`` takes; ``source_options`` are more ``format("orbit")``
    options (credentials: an operator's, since the usage topic is in no tenant's namespace)."""

    namesrv: str
    database_url: str = field(repr=False)  # holds a password: never shown
    checkpoint_dir: str
    pipeline: str = "usage-metering"
    topic: str = USAGE_TOPIC
    trigger_interval_s: float = 10.0
    max_messages_per_trigger: int = 100_000
    available_now: bool = False  # read what is there, then stop (a catch-up run, and the tests)
    source_options: Mapping[str, str] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        problems = []
        if not self.namesrv:
            problems.append("namesrv is required")
        if not self.database_url.startswith(("postgres://", "postgresql://")):
            problems.append("database_url must be a postgresql:// URL")
        if not self.checkpoint_dir:
            problems.append("checkpoint_dir is required (Spark keeps the stream's offsets there)")
        if not self.pipeline or len(self.pipeline) > 100:
            problems.append("pipeline must be a name of 1..100 characters")
        if self.trigger_interval_s <= 0:
            problems.append("trigger_interval_s must be > 0")
        if self.max_messages_per_trigger < 1:
            problems.append("max_messages_per_trigger must be >= 1")
        if problems:
            raise OrbitSparkError("metering pipeline: " + "; ".join(problems))


def usage_records(spark: SparkSession, opts: MeteringOptions) -> DataFrame:
    """The usage topic as a stream of parsed records, with each message's position."""
    raw = (
        spark.readStream.format("orbit")
        .option("namesrv", opts.namesrv)
        .option("topic", opts.topic)
        .option("startingOffsets", "earliest")
        .option("maxMessagesPerTrigger", str(opts.max_messages_per_trigger))
        .options(**opts.source_options)
        .load()
    )
    return raw.select(
        F.col("topic"),
        F.col("broker").alias("queue_broker"),
        F.col("queue_id"),
        F.col("queue_offset"),
        F.from_json(F.col("body").cast("string"), RECORD_SCHEMA).alias("r"),
    ).select("topic", "queue_broker", "queue_id", "queue_offset", "r.*")


def _valid() -> Column:
    """A record every field of which is there (tiered_bytes and the sparse counters may be left
    out), with no negative count."""
    ok = F.col("report_id").isNotNull() & F.col("tenant").isNotNull() & F.col("broker").isNotNull()
    for c in ("minute", *_COUNTERS, "stored_bytes"):
        ok = ok & F.col(c).isNotNull() & (F.col(c) >= 0)
    for c in ("tiered_bytes", *_SPARSE_COUNTERS):
        ok = ok & (F.col(c).isNull() | (F.col(c) >= 0))
    return ok


def _sums() -> list[Column]:
    return [
        *[F.sum(c).alias(c) for c in _COUNTERS],
        *[F.sum(F.coalesce(F.col(c), F.lit(0))).alias(c) for c in _SPARSE_COUNTERS],
    ]


def not_applied(records: DataFrame, applied: Mapping[QueuePosition, int]) -> DataFrame:
    """The records at or past their queue's applied offset (all of them for a queue never seen)."""
    if not applied:
        return records
    done = F.lit(False)
    for (topic, broker, queue_id), next_offset in applied.items():
        done = done | (
            (F.col("topic") == topic)
            & (F.col("queue_broker") == broker)
            & (F.col("queue_id") == queue_id)
            & (F.col("queue_offset") < next_offset)
        )
    return records.filter(~done)


def per_minute(records: DataFrame) -> DataFrame:
    """Per tenant, minute (epoch ms; a record's period start rounded down) and broker."""
    return (
        records.withColumn("minute_ms", F.col("minute") - F.col("minute") % MINUTE_MS)
        .groupBy("tenant", "minute_ms", "broker")
        .agg(
            *_sums(),
            F.max("stored_bytes").alias("stored_bytes"),
            F.count(F.lit(1)).alias("records"),
            F.max(F.coalesce(F.col("tiered_bytes"), F.lit(0))).alias("tiered_bytes"),
        )
    )


def per_hour(records: DataFrame) -> DataFrame:
    return (
        records.withColumn("hour_ms", F.col("minute") - F.col("minute") % HOUR_MS)
        .groupBy("tenant", "hour_ms")
        .agg(*_sums(), F.count(F.lit(1)).alias("records"))
    )


class BillingSink:
    """The ``foreachBatch`` function: one PostgreSQL transaction per micro-batch."""

    def __init__(self, opts: MeteringOptions) -> None:
        self.opts = opts
        self.batches = 0

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        store = BillingStore(self.opts.database_url, pipeline=self.opts.pipeline)
        try:
            applied = store.begin()
            try:
                self._apply(store, batch, batch_id, applied)
            except BaseException as e:
                store.rollback(e)
                raise
            store.commit()
        finally:
            store.close()
        self.batches += 1

    def _apply(self, store: BillingStore, batch: DataFrame, batch_id: int, applied: dict[QueuePosition, int]) -> None:
        fresh = not_applied(batch, applied).persist()
        try:
            bad = fresh.filter(~_valid()).select("topic", "queue_broker", "queue_id", "queue_offset").collect()
            for r in bad[:20]:
                log.error(
                    "usage message %s %s:%d@%d is not a usage record: skipped",
                    r.topic, r.queue_broker, r.queue_id, r.queue_offset,
                )  # fmt: skip
            good = fresh.filter(_valid())
            minutes = [
                MinuteRow(r.tenant, r.minute_ms, r.broker, r.requests_4k, r.bytes_in, r.bytes_out,
                          r.stored_bytes, r.records, r.tiered_bytes, r.messages_in, r.messages_out,
                          r.throttled_requests)
                for r in per_minute(good).collect()
            ]  # fmt: skip
            hours = [
                HourRow(r.tenant, r.hour_ms, r.requests_4k, r.bytes_in, r.bytes_out, r.records, r.messages_in,
                        r.messages_out, r.throttled_requests)
                for r in per_hour(good).collect()
            ]  # fmt: skip
            ends = {
                (r.topic, r.queue_broker, r.queue_id): r.next_offset
                for r in fresh.groupBy("topic", "queue_broker", "queue_id")
                .agg((F.max("queue_offset") + 1).alias("next_offset"))
                .collect()
            }
        finally:
            fresh.unpersist()
        store.add_minutes(minutes)
        store.add_hours(hours)
        store.raise_hour_peaks(minutes)
        store.advance_offsets(ends, batch_id)
        log.info(
            "metering batch %d: %d records in %d tenant-minutes, %d tenant-hours (%d not records)",
            batch_id, sum(m.records for m in minutes), len(minutes), len(hours), len(bad),
        )  # fmt: skip


def start(spark: SparkSession, opts: MeteringOptions) -> StreamingQuery:
    """Start the pipeline's streaming query (the caller awaits or stops it)."""
    writer = (
        usage_records(spark, opts)
        .writeStream.queryName(f"orbit-{opts.pipeline}")
        .option("checkpointLocation", opts.checkpoint_dir)
        .foreachBatch(BillingSink(opts))
    )
    if opts.available_now:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=f"{opts.trigger_interval_s} seconds")
    return writer.start()
