"""``spark.readStream`` / ``writeStream`` with ``format("orbit")``: real Spark (local[2], the shared
session) against a real name server and broker — restarts from the checkpoint with exact counts,
``Trigger.AvailableNow`` with ``maxMessagesPerTrigger``, offsets committed to a group, a stream
written back to a topic, and retention deleting what a checkpoint still needs."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.streaming.query import StreamingQuery

from sdk import BlockingProducer, Message, MessageQueue
from sdk.admin import AdminClient, QueueProgress
from tests.integration.conftest import SMALL_STORE
from tests.integration.helpers import NO_DISK_POLICY
from tests.integration.spark_support import (  # noqa: F401
    OrbitCluster,
    SparkHandle,
    orbit_cluster_fixture,
    spark_fixture,
    start_orbit_cluster,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

QUERY_TIMEOUT_S = 120


def fixed_queue(mq: MessageQueue, queues: Sequence[MessageQueue], msg: Message) -> MessageQueue:
    return mq


def produce(addr: str, topic: str, per_queue: int, tag: str, *, body_bytes: int = 0) -> list[bytes]:
    """``per_queue`` messages into every queue of ``topic``; their bodies."""
    bodies: list[bytes] = []
    with BlockingProducer(f"stream-test-{tag}", namesrv_addrs=addr) as p:
        for i in range(per_queue):
            for mq in p.fetch_publish_queues(topic):
                body = f"{tag}-{mq.queue_id}-{i}".encode().ljust(body_bytes, b".")
                p.send(Message(topic, body), queue_selector=functools.partial(fixed_queue, mq))
                bodies.append(body)
    return bodies


def stream(spark: SparkHandle, addr: str, **options: str) -> DataFrame:
    return spark.session.readStream.format("orbit").option("namesrv", addr).options(**options).load()


def run_available_now(df: DataFrame, checkpoint: Path, sink: Path) -> StreamingQuery:
    """Run the stream with Trigger.AvailableNow into a Parquet sink until it stops by itself."""
    q = (
        df.select("topic", "queue_id", "queue_offset", "body")
        .writeStream.format("parquet")
        .option("checkpointLocation", str(checkpoint))
        .option("path", str(sink))
        .trigger(availableNow=True)
        .start()
    )
    assert q.awaitTermination(QUERY_TIMEOUT_S), "the AvailableNow query did not finish"
    return q


def sink_rows(spark: SparkHandle, sink: Path) -> list[Any]:
    return spark.session.read.parquet(str(sink)).collect()


def progress(addr: str, group: str, topic: str) -> list[QueueProgress]:
    async def get() -> list[QueueProgress]:
        async with AdminClient([addr]) as admin:
            return await admin.group_progress(group, topic)

    return asyncio.run(get())


def test_restarts_read_every_message_once_and_commit_progress_to_a_group(
    spark: SparkHandle, orbit_cluster: OrbitCluster, tmp_path: Path
) -> None:
    topic, late, group = "stream-restarts", "stream-restarts-late", "stream-restarts-progress"
    orbit_cluster.create_topic(topic, 4)
    checkpoint, sink = tmp_path / "checkpoint", tmp_path / "sink"
    df = stream(spark, orbit_cluster.addr, topicPattern="stream-restarts(-late)?", commitToGroup=group)
    expected: list[bytes] = []
    sent_per_queue = 0
    for run, per_queue in enumerate((5, 3, 4)):  # the first run, then two restarts from the checkpoint
        expected += produce(orbit_cluster.addr, topic, per_queue, f"run{run}")
        sent_per_queue += per_queue
        if run == 1:  # a topic matching the pattern appears: read from its first message
            orbit_cluster.create_topic(late, 2)
            expected += produce(orbit_cluster.addr, late, 3, "late")
        run_available_now(df, checkpoint, sink)
        rows = sink_rows(spark, sink)
        positions = [(r.topic, r.queue_id, r.queue_offset) for r in rows]
        assert len(positions) == len(set(positions)), f"run {run}: a message was written twice"
        assert sorted(bytes(r.body) for r in rows) == sorted(expected), f"run {run}"
        # Spark committed the batch's end to the group: `orbit group progress` shows no lag.
        lag = progress(orbit_cluster.addr, group, topic)
        want = [(q, sent_per_queue, 0) for q in range(4)]
        assert [(p.queue_id, p.consumer_offset, p.lag) for p in lag] == want, f"run {run}"


def test_available_now_reads_in_batches_of_max_messages_per_trigger(
    spark: SparkHandle, orbit_cluster: OrbitCluster, tmp_path: Path
) -> None:
    topic = "stream-limited"
    orbit_cluster.create_topic(topic, 4)
    produce(orbit_cluster.addr, topic, 10, "limited")  # 40 messages
    df = stream(spark, orbit_cluster.addr, topic=topic, maxMessagesPerTrigger="15")
    q = run_available_now(df, tmp_path / "checkpoint", tmp_path / "sink")
    batches = [p["numInputRows"] for p in q.recentProgress if p["numInputRows"]]
    assert batches == [15, 15, 10]
    assert len(sink_rows(spark, tmp_path / "sink")) == 40


def test_stream_written_to_a_topic_reads_back(spark: SparkHandle, orbit_cluster: OrbitCluster, tmp_path: Path) -> None:
    source, target = "stream-source", "stream-target"
    orbit_cluster.create_topic(source, 2)
    orbit_cluster.create_topic(target, 3)
    bodies = produce(orbit_cluster.addr, source, 25, "copy")
    out = stream(spark, orbit_cluster.addr, topic=source).select(
        F.concat(F.lit(b"copy of "), F.col("body")).alias("body"),
        F.lit("copied").alias("tags"),
        F.concat_ws(":", "topic", "broker", "queue_id", "queue_offset").alias("idempotency_key"),
    )
    q = (
        out.writeStream.format("orbit")
        .option("namesrv", orbit_cluster.addr)
        .option("topic", target)
        .option("batchSize", "8")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    assert q.awaitTermination(QUERY_TIMEOUT_S)
    got = spark.session.read.format("orbit").option("namesrv", orbit_cluster.addr).option("topic", target).load()
    rows = got.collect()
    assert sorted(bytes(r.body) for r in rows) == sorted(b"copy of " + b for b in bodies)
    assert {r.tags for r in rows} == {"copied"}
    keys = [r.properties["idempotency_key"] for r in rows]
    assert len(set(keys)) == len(bodies)
    assert all(k.startswith(f"{source}:broker-a:") for k in keys)


# --- retention deleting what a checkpoint needs ------------------------------------------------------
# 64 KiB CommitLog files kept 1.8 s, looked at every 0.2 s: writing ~5 files makes the old ones go.
RETENTION_STORE = [
    *SMALL_STORE,
    *NO_DISK_POLICY,
    "--store-set", "commit_log_file_size_bytes=65536",
    "--store-set", "max_message_size_bytes=16384",
    "--store-set", "file_reserved_time_hours=0.0005",
    "--store-set", "clean_resource_interval_ms=200",
    "--store-set", "preallocate_next_file=false",  # so the file being written is the only one left
]  # fmt: skip


def test_retention_gap_fails_or_skips_as_fail_on_data_loss_says(spark: SparkHandle, tmp_path: Path) -> None:
    with start_orbit_cluster(tmp_path, broker_name="broker-r", store_flags=RETENTION_STORE) as cluster:
        retention_gap(spark, cluster, tmp_path)


def retention_gap(spark: SparkHandle, cluster: OrbitCluster, tmp: Path) -> None:
    topic = "stream-retention"
    cluster.create_topic(topic, 1)
    first = produce(cluster.addr, topic, 10, "early", body_bytes=200)  # all in the file being written
    strict = stream(spark, cluster.addr, topic=topic)
    lenient = stream(spark, cluster.addr, topic=topic, failOnDataLoss="false")
    for name, df in (("strict", strict), ("lenient", lenient)):
        run_available_now(df, tmp / name / "checkpoint", tmp / name / "sink")
        assert len(sink_rows(spark, tmp / name / "sink")) == len(first)
    # ~300 KiB more: five files roll over, and retention deletes the old ones (offsets 0 .. ~250).
    produce(cluster.addr, topic, 300, "late", body_bytes=1000)
    # Wait until only the file being written is left (then the queue's min offset stays put).
    commit_log = tmp / "store" / "store" / "commitlog"
    deadline = time.monotonic() + 30
    while len(list(commit_log.iterdir())) > 1 or progress(cluster.addr, "nobody", topic)[0].min_offset <= len(first):
        assert time.monotonic() < deadline, f"retention did not delete the old files: {sorted(commit_log.iterdir())}"
        time.sleep(0.2)
    [queue] = progress(cluster.addr, "nobody", topic)
    lo, hi = queue.min_offset, queue.broker_offset
    assert hi == 310

    with pytest.raises(Exception, match="failOnDataLoss=false") as failed:
        run_available_now(strict, tmp / "strict" / "checkpoint", tmp / "strict" / "sink")
    text = str(failed.value)
    assert f"queue broker-r:0 of topic '{topic}'" in text
    assert f"offsets {len(first)}..309" in text
    assert f"deleted the messages before offset {lo}" in text
    assert len(sink_rows(spark, tmp / "strict" / "sink")) == len(first)  # nothing written past the gap

    run_available_now(lenient, tmp / "lenient" / "checkpoint", tmp / "lenient" / "sink")
    rows = sink_rows(spark, tmp / "lenient" / "sink")
    offsets = sorted(r.queue_offset for r in rows)
    assert offsets == list(range(len(first))) + list(range(lo, hi))  # what is left, once each
    logged = spark.log_text()
    assert "skipping" in logged
    assert "failOnDataLoss=false" in logged
