"""``orbit bench spark``: what ``format("orbit")`` moves per second on this machine.

A local cluster (name server + broker, ports picked by the OS) in a temporary directory and a
local Spark session (``local[N]``); then, each timed from the action's start to its end
(query start-up included, Spark's own start-up not):

    write         spark.write.format("orbit") of ``messages`` rows (``message_bytes`` bodies)
    stream_read   readStream.format("orbit") → format("noop"), Trigger.AvailableNow: every message
                  of the topic through the streaming source into a sink that drops them
    stream_write  readStream.format("orbit") → writeStream.format("orbit") into a second topic,
                  Trigger.AvailableNow: a streaming read and a streaming write of every message

A small warm-up query runs first, so the Python workers are already started. The figures depend
on what else the machine runs; the JSON says how many cores there were.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from data_plane.interpreter import interpreter_facts
from data_plane.local_cluster import LocalCluster

# A broker store sized for a benchmark, not for production (no 1 GiB files reserved ahead).
STORE_FLAGS = ["--store-set", "commit_log_file_size_bytes=268435456", "--store-set", "reserve_ahead_bytes=0"]


@dataclass(frozen=True)
class SparkBenchOptions:
    messages: int = 200_000
    message_bytes: int = 100
    queues: int = 8
    spark_cores: int = 2
    max_messages_per_trigger: int = 0  # 0: no limit (one micro-batch)
    directory: str | None = None

    @classmethod
    def quick(cls, directory: str | None = None) -> SparkBenchOptions:
        return cls(messages=20_000, directory=directory)

    def __post_init__(self) -> None:
        if self.messages < 1 or self.message_bytes < 1 or self.queues < 1 or self.spark_cores < 1:
            raise ValueError("messages, message_bytes, queues and spark_cores must be >= 1")
        if self.max_messages_per_trigger < 0:
            raise ValueError("max_messages_per_trigger must be >= 0")


def _create_topics(namesrv: str, topics: list[str], queues: int) -> None:
    from sdk.admin import AdminClient

    async def go() -> None:
        async with AdminClient([namesrv]) as admin:
            for t in topics:
                await admin.create_topic(t, queue_nums=queues)
            for t in topics:  # wait for the routes
                for _ in range(100):
                    try:
                        await admin.route(t)
                        break
                    except Exception:
                        await asyncio.sleep(0.1)

    asyncio.run(go())


def _rate(n: int, seconds: float) -> dict[str, Any]:
    return {"messages": n, "seconds": round(seconds, 2), "msgs_per_s": round(n / seconds) if seconds > 0 else 0}


def run(opts: SparkBenchOptions, log: Callable[[str], None] = lambda m: None) -> dict[str, Any]:
    root = opts.directory or tempfile.mkdtemp(prefix="orbit-bench-spark-")
    try:
        return _run(opts, root, log)
    finally:
        if opts.directory is None:
            shutil.rmtree(root, ignore_errors=True)


def _run(opts: SparkBenchOptions, root: str, log: Callable[[str], None]) -> dict[str, Any]:
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from spark_integration import register

    result: dict[str, Any] = {"options": asdict(opts), "machine": {"cpus": os.cpu_count(), **interpreter_facts()}}
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    with LocalCluster(root, namesrv_port=0, broker_port=0, broker_flags=STORE_FLAGS) as cluster:
        ns = cluster.namesrv
        _create_topics(ns, ["bench-spark", "bench-spark-copy", "bench-spark-warmup"], opts.queues)
        log(f"cluster up (name server {ns}); starting Spark local[{opts.spark_cores}]")
        spark = (
            SparkSession.builder.master(f"local[{opts.spark_cores}]")
            .appName("orbit-bench-spark")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", str(opts.spark_cores))
            .config("spark.python.worker.reuse", "true")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        register(spark)
        try:
            limit = (
                {"maxMessagesPerTrigger": str(opts.max_messages_per_trigger)} if opts.max_messages_per_trigger else {}
            )

            def source(topic: str) -> Any:
                return (
                    spark.readStream.format("orbit")
                    .option("namesrv", ns)
                    .option("topic", topic)
                    .options(**limit)
                    .load()
                )

            def until_done(query: Any) -> int:
                query.awaitTermination()
                if query.exception() is not None:
                    raise RuntimeError(str(query.exception()))
                return sum(int(p["numInputRows"]) for p in query.recentProgress)

            ckpt = os.path.join(root, "checkpoints")
            log("warm-up")
            spark.range(100).select(F.lit(b"w").alias("body")).write.format("orbit").option("namesrv", ns).option(
                "topic", "bench-spark-warmup"
            ).mode("append").save()
            until_done(
                source("bench-spark-warmup").writeStream.format("noop")
                .option("checkpointLocation", os.path.join(ckpt, "warmup")).trigger(availableNow=True).start()
            )  # fmt: skip

            log(f"write: {opts.messages} messages of {opts.message_bytes} bytes")
            pad = "x" * max(0, opts.message_bytes - 12)
            rows = spark.range(opts.messages, numPartitions=opts.spark_cores).select(
                F.concat(F.lpad(F.col("id").cast("string"), 12, "0"), F.lit(pad)).cast("binary").alias("body")
            )
            started = time.perf_counter()
            rows.write.format("orbit").option("namesrv", ns).option("topic", "bench-spark").mode("append").save()
            result["write"] = _rate(opts.messages, time.perf_counter() - started)
            log(f"  {result['write']}")

            log("stream_read: into a no-op sink")
            started = time.perf_counter()
            read = until_done(
                source("bench-spark").writeStream.format("noop")
                .option("checkpointLocation", os.path.join(ckpt, "read")).trigger(availableNow=True).start()
            )  # fmt: skip
            result["stream_read"] = _rate(read, time.perf_counter() - started)
            log(f"  {result['stream_read']}")

            log("stream_write: read the topic and write it to another")
            started = time.perf_counter()
            copied = until_done(
                source("bench-spark").select("body").writeStream.format("orbit")
                .option("namesrv", ns).option("topic", "bench-spark-copy")
                .option("checkpointLocation", os.path.join(ckpt, "copy")).trigger(availableNow=True).start()
            )  # fmt: skip
            result["stream_write"] = _rate(copied, time.perf_counter() - started)
            log(f"  {result['stream_write']}")
            if read != opts.messages or copied != opts.messages:
                raise RuntimeError(f"expected {opts.messages} messages, read {read} and copied {copied}")
        finally:
            spark.stop()
    return result
