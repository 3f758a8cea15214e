"""``format("orbit")`` batch read and write with real Spark (local[2]) against a real name
server and broker: every column, the offset options, partitions = queues, writing back."""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import orjson
import pytest
from pyspark.sql import DataFrame
from pyspark.sql.types import ArrayType, BinaryType, MapType, StringType, StructField, StructType

from sdk import BlockingProducer, BlockingPullConsumer, Message, MessageExt, MessageQueue
from tests.integration.spark_support import OrbitCluster, SparkHandle, orbit_cluster_fixture, spark_fixture  # noqa: F401

pytestmark = pytest.mark.timeout(300)

QUEUES = 4
PER_QUEUE = 5


def fixed_queue(mq: MessageQueue, queues: Sequence[MessageQueue], msg: Message) -> MessageQueue:
    return mq


def ms(dt: datetime) -> int:
    return round(dt.timestamp() * 1000)


def read(spark: SparkHandle, addr: str, **options: str) -> DataFrame:
    return spark.session.read.format("orbit").option("namesrv", addr).options(**options).load()


def pull_all(addr: str, topic: str, expect: int) -> list[MessageExt]:
    """Every message of ``topic`` through the SDK, from each queue's start."""
    got: list[MessageExt] = []
    c = BlockingPullConsumer(f"check-{topic}-{time.monotonic_ns()}", namesrv_addrs=addr, consume_from="FIRST_OFFSET")
    c.assign(c.fetch_queues(topic))
    with c:
        deadline = time.monotonic() + 20
        while len(got) < expect and time.monotonic() < deadline:
            got.extend(c.poll(500))
    return got


@pytest.fixture(scope="module")
def produced(orbit_cluster: OrbitCluster) -> tuple[str, list[MessageExt], int]:
    """Topic ``spark-read`` (4 queues) with 5 messages per queue; the messages as the SDK reads
    them, and a store time between the 2nd and the 3rd round."""
    topic = "spark-read"
    orbit_cluster.create_topic(topic, QUEUES)
    middle = 0
    with BlockingProducer("spark-test-producer", namesrv_addrs=orbit_cluster.addr) as p:
        queues = p.fetch_publish_queues(topic)
        assert len(queues) == QUEUES
        for i in range(PER_QUEUE):
            if i == 2:
                time.sleep(0.05)
                middle = int(time.time() * 1000)
                time.sleep(0.05)
            for mq in queues:
                msg = Message(
                    topic,
                    f"body-{mq.queue_id}-{i}".encode() + b"\x00\xff",
                    tags=f"tag{i % 2}",
                    keys=[f"k{mq.queue_id}-{i}", "shared"],
                    properties={"n": str(i), "q": str(mq.queue_id)},
                )
                p.send(msg, queue_selector=functools.partial(fixed_queue, mq))
    msgs = pull_all(orbit_cluster.addr, topic, QUEUES * PER_QUEUE)
    assert len(msgs) == QUEUES * PER_QUEUE
    return topic, msgs, middle


def test_read_every_column(spark: SparkHandle, orbit_cluster: OrbitCluster, produced: Any) -> None:
    topic, msgs, _ = produced
    df = read(spark, orbit_cluster.addr, topic=topic)
    assert [f.name for f in df.schema.fields] == [
        "topic", "queue_id", "queue_offset", "msg_id", "keys", "tags", "properties", "body",
        "born_timestamp", "store_timestamp", "broker",
    ]  # fmt: skip
    rows = {(r.queue_id, r.queue_offset): r for r in df.collect()}
    assert len(rows) == len(msgs)
    for m in msgs:
        r = rows[(m.queue_id, m.queue_offset)]
        assert r.topic == topic
        assert r.msg_id == m.msg_id
        assert r.keys == list(m.keys)
        assert r.tags == m.tags
        assert r.properties == {"n": m.properties["n"], "q": m.properties["q"]}
        assert bytes(r.body) == m.body
        assert ms(r.born_timestamp) == m.born_timestamp_ms
        assert ms(r.store_timestamp) == m.store_timestamp_ms
        assert r.broker == m.broker_name == "broker-a"


def test_partitions_are_queues(spark: SparkHandle, orbit_cluster: OrbitCluster, produced: Any) -> None:
    topic, _, _ = produced
    df = read(spark, orbit_cluster.addr, topic=topic)
    assert df.rdd.getNumPartitions() == QUEUES
    per = df.rdd.glom().map(lambda rows: sorted({r.queue_id for r in rows})).collect()
    assert sorted(per) == [[q] for q in range(QUEUES)]
    split = read(spark, orbit_cluster.addr, topic=topic, maxRecordsPerPartition="2")
    assert split.rdd.getNumPartitions() == QUEUES * 3  # 5 messages → 2 + 2 + 1
    assert split.count() == QUEUES * PER_QUEUE


def test_offset_options(spark: SparkHandle, orbit_cluster: OrbitCluster, produced: Any) -> None:
    topic, msgs, middle = produced
    addr = orbit_cluster.addr
    assert read(spark, addr, topic=topic, startingOffsets="latest").count() == 0
    assert read(spark, addr, topic=topic, startingOffsets="earliest", endingOffsets="latest").count() == len(msgs)
    ranges = {topic: {"broker-a:0": 1, "broker-a:2": 3}}
    ends = {topic: {"broker-a:0": 3, "broker-a:1": 0, "broker-a:2": -1, "broker-a:3": 0}}
    got = read(
        spark,
        addr,
        topic=topic,
        startingOffsets=orjson.dumps(ranges).decode(),
        endingOffsets=orjson.dumps(ends).decode(),
    ).collect()
    assert sorted((r.queue_id, r.queue_offset) for r in got) == [(0, 1), (0, 2), (2, 3), (2, 4)]
    since = read(spark, addr, topic=topic, startingTimestamp=str(middle)).collect()
    expected = sorted((m.queue_id, m.queue_offset) for m in msgs if m.store_timestamp_ms >= middle)
    assert sorted((r.queue_id, r.queue_offset) for r in since) == expected
    assert len(expected) == QUEUES * (PER_QUEUE - 2)
    until = read(spark, addr, topic=topic, endingTimestamp=str(middle)).count()
    assert until == QUEUES * 2


def test_several_topics_and_pattern(spark: SparkHandle, orbit_cluster: OrbitCluster, produced: Any) -> None:
    topic, msgs, _ = produced
    other = "spark-other"
    orbit_cluster.create_topic(other, 2)
    with BlockingProducer("spark-test-producer2", namesrv_addrs=orbit_cluster.addr) as p:
        for i in range(3):
            p.send(Message(other, f"o{i}".encode()))
    both = read(spark, orbit_cluster.addr, topics=f"{topic},{other}")
    assert both.rdd.getNumPartitions() == QUEUES + 2
    counts = {r.topic: r["count"] for r in both.groupBy("topic").count().collect()}
    assert counts == {topic: len(msgs), other: 3}
    by_pattern = read(spark, orbit_cluster.addr, topicPattern="spark-(read|other)")
    assert by_pattern.count() == len(msgs) + 3


def test_bad_options_fail_clearly(spark: SparkHandle, orbit_cluster: OrbitCluster) -> None:
    with pytest.raises(Exception, match="option namesrv is required"):
        spark.session.read.format("orbit").option("topic", "x").load().collect()
    with pytest.raises(Exception, match="startingOffsets must be"):
        read(spark, orbit_cluster.addr, topic="x", startingOffsets="soonest").collect()
    with pytest.raises(Exception, match="unknown read option"):
        read(spark, orbit_cluster.addr, topic="x", startingOffset="earliest").collect()
    with pytest.raises(Exception, match="does-not-exist"):
        read(spark, orbit_cluster.addr, topic="does-not-exist").collect()


def test_write_then_read_with_sdk(spark: SparkHandle, orbit_cluster: OrbitCluster) -> None:
    topic = "spark-write"
    orbit_cluster.create_topic(topic, QUEUES)
    schema = StructType(
        [
            StructField("body", BinaryType(), False),
            StructField("keys", ArrayType(StringType()), True),
            StructField("tags", StringType(), True),
            StructField("properties", MapType(StringType(), StringType()), True),
            StructField("sharding_key", StringType(), True),
            StructField("idempotency_key", StringType(), True),
        ]
    )
    n = 60
    data = [
        (f"w{i}".encode(), [f"key{i}"], "even" if i % 2 == 0 else None, {"i": str(i)}, f"user{i % 3}", f"id-{i}")
        for i in range(n)
    ]
    df = spark.session.createDataFrame(data, schema).repartition(3)
    (
        df.write.format("orbit")
        .option("namesrv", orbit_cluster.addr)
        .option("topic", topic)
        .option("batchSize", "7")
        .mode("append")
        .save()
    )
    got = pull_all(orbit_cluster.addr, topic, n)
    assert len(got) == n
    by_id = {m.properties["idempotency_key"]: m for m in got}
    assert sorted(by_id) == sorted(f"id-{i}" for i in range(n))
    for i in range(n):
        m = by_id[f"id-{i}"]
        assert m.body == f"w{i}".encode()
        assert m.keys == (f"key{i}",)
        assert m.tags == ("even" if i % 2 == 0 else None)
        assert m.properties["i"] == str(i)
    # A sharding key keeps its rows in one queue (in row order within a Spark task).
    queues: dict[str, set[int]] = {}
    for m in got:
        queues.setdefault(f"user{int(m.properties['i']) % 3}", set()).add(m.queue_id)
    assert len(queues) == 3
    assert all(len(q) == 1 for q in queues.values())
    # The read DataFrame can be written back as it is (read-only columns are ignored).
    copy = "spark-copy"
    orbit_cluster.create_topic(copy, 2)
    read(spark, orbit_cluster.addr, topic=topic).drop("topic").write.format("orbit").option(
        "namesrv", orbit_cluster.addr
    ).option("topic", copy).mode("append").save()
    assert read(spark, orbit_cluster.addr, topic=copy).count() == n


def test_write_errors(spark: SparkHandle, orbit_cluster: OrbitCluster) -> None:
    df = spark.session.createDataFrame([("x", 1)], "payload string, n int")
    with pytest.raises(Exception, match="needs a 'body' column"):
        df.write.format("orbit").option("namesrv", orbit_cluster.addr).option("topic", "t").mode("append").save()
    ok = spark.session.createDataFrame([("x",)], "body string")
    with pytest.raises(Exception, match="append-only"):
        ok.write.format("orbit").option("namesrv", orbit_cluster.addr).option("topic", "t").mode("overwrite").save()
