"""A worked example for tenants: count a topic's messages per minute and tag, into Parquet files.

    python -m spark_integration.pipelines.example_parquet \\
        --namesrv 127.0.0.1:9876 --topic 'demo%hello' --out ./orders-per-minute --checkpoint ./ckpt

with the tenant's credentials in the environment (``ORBIT_CLIENT_ID``, ``ORBIT_CLIENT_SECRET``,
``ORBIT_TOKEN_URL`` — ``orbit dev up`` prints the demo tenant's). The job:

1. reads the topic as a stream (``readStream.format("orbit")``; from the earliest message);
2. groups by one-minute windows of ``store_timestamp`` and by ``tags``, counting messages and
   body bytes — with a two-minute watermark, so a minute's row is final (and written) once
   messages stored two minutes after it have been read;
3. appends each final row to Parquet under ``--out`` (Spark's file sink: exactly once with the
   checkpoint).

Stop it with Ctrl-C and start it again with the same ``--checkpoint``: it goes on where it
stopped. ``--available-now`` reads what is there and stops (minutes still inside the watermark
are written by the next run). Read the result with ``spark.read.parquet(out)``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.query import StreamingQuery

from spark_integration import register


def messages_per_minute(spark: SparkSession, *, namesrv: str, topic: str) -> DataFrame:
    """Per minute (of store time) and tag: how many messages, and their body bytes."""
    messages = (
        spark.readStream.format("orbit")
        .option("namesrv", namesrv)
        .option("topic", topic)
        .option("startingOffsets", "earliest")
        .load()
    )
    return (
        messages.withWatermark("store_timestamp", "2 minutes")
        .groupBy(F.window("store_timestamp", "1 minute"), F.coalesce("tags", F.lit("")).alias("tag"))
        .agg(F.count(F.lit(1)).alias("messages"), F.sum(F.length("body")).alias("body_bytes"))
        .select(F.col("window.start").alias("minute"), "tag", "messages", "body_bytes")
    )


def start(
    spark: SparkSession, *, namesrv: str, topic: str, out: str, checkpoint: str, available_now: bool
) -> StreamingQuery:
    writer = (
        messages_per_minute(spark, namesrv=namesrv, topic=topic)
        .writeStream.format("parquet")
        .outputMode("append")
        .option("path", out)
        .option("checkpointLocation", checkpoint)
    )
    writer = writer.trigger(availableNow=True) if available_now else writer.trigger(processingTime="30 seconds")
    return writer.start()


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--namesrv", required=True)
    ap.add_argument("--topic", required=True, help="the wire name, tenant%%name")
    ap.add_argument("--out", required=True, help="directory of the Parquet files")
    ap.add_argument("--checkpoint", required=True, help="Spark checkpoint directory (keep it across runs)")
    ap.add_argument("--available-now", action="store_true", help="read what is there, then stop")
    ap.add_argument("--master", default="local[2]")
    args = ap.parse_args(argv)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.master(args.master)
        .appName("orbit-example-parquet")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")
    register(spark)
    try:
        query = start(
            spark,
            namesrv=args.namesrv,
            topic=args.topic,
            out=os.path.abspath(args.out),
            checkpoint=os.path.abspath(args.checkpoint),
            available_now=args.available_now,
        )
        try:
            query.awaitTermination()
        except KeyboardInterrupt:
            query.stop()
        return 0
    finally:
        spark.stop()


if __name__ == "__main__":
    sys.exit(main())
