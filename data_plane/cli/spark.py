"""``orbit pipeline metering`` and ``orbit bench spark``: the Spark jobs from the command line.

PySpark is an optional extra (``pip install 'orbit-mq[spark]'``): it is imported when one of
these commands runs, never when ``orbit`` starts.

    orbit pipeline metering --namesrv 127.0.0.1:9876 --database-url postgresql://... --checkpoint DIR
    orbit bench spark [--quick] [--messages N] [--out FILE]

Credentials for the usage topic (an operator's: it is in no tenant's namespace) come from
``--credentials-file`` + ``--token-url``, else from the environment as for every
``format("orbit")`` job (``ORBIT_CLIENT_ID`` / ``ORBIT_CLIENT_SECRET`` / ``ORBIT_TOKEN_URL``,
``ORBIT_TOKEN``, ``ORBIT_ACCESS_KEY`` / ``ORBIT_SECRET_KEY``); the database URL from
``--database-url`` or ``DATABASE_URL``. Neither is ever printed.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import sys
import threading
from typing import Any

import orjson


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _metering(args: argparse.Namespace) -> int:
    database_url = args.database_url or os.environ.get("DATABASE_URL", "")
    if not database_url:
        _log("orbit pipeline metering: give --database-url or set DATABASE_URL")
        return 2
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    from spark_integration import register
    from spark_integration.errors import OrbitSparkError
    from spark_integration.pipelines import metering

    source: dict[str, str] = {}
    if args.credentials_file:
        from data_plane.dev_tenancy import read_credentials

        creds = read_credentials(args.credentials_file)
        if creds is None or not args.token_url:
            _log("orbit pipeline metering: --credentials-file needs access_key and secret in it, and --token-url")
            return 2
        source = {"clientId": creds[0], "clientSecret": creds[1], "tokenUrl": args.token_url}
    try:
        opts = metering.MeteringOptions(
            source_options=source,
            namesrv=args.namesrv,
            database_url=database_url,
            checkpoint_dir=os.path.abspath(args.checkpoint),
            pipeline=args.pipeline,
            trigger_interval_s=args.trigger_interval_s,
            max_messages_per_trigger=args.max_messages_per_trigger,
            available_now=args.available_now,
        )
    except OrbitSparkError as e:
        _log(str(e))
        return 2
    spark = (
        SparkSession.builder.master(args.master)
        .appName(f"orbit-{opts.pipeline}")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")
    register(spark)
    stopping = threading.Event()
    try:
        query = metering.start(spark, opts)
        _log(f"metering pipeline {opts.pipeline!r}: {opts.topic} at {opts.namesrv}, checkpoint {opts.checkpoint_dir}")

        def stop(*_: Any) -> None:
            stopping.set()
            query.stop()

        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGTERM, stop)
        while not query.awaitTermination(1):
            pass
        if query.exception() is not None and not stopping.is_set():
            _log(f"metering pipeline failed: {query.exception()}")
            return 1
        return 0
    finally:
        spark.stop()


def _bench_spark(args: argparse.Namespace) -> int:
    from benchmarks import spark as bench

    opts = bench.SparkBenchOptions.quick(args.dir) if args.quick else bench.SparkBenchOptions(directory=args.dir)
    overrides = {
        k: getattr(args, k) for k in ("messages", "message_bytes", "queues", "spark_cores") if getattr(args, k)
    }
    if args.max_messages_per_trigger is not None:
        overrides["max_messages_per_trigger"] = args.max_messages_per_trigger
    opts = dataclasses.replace(opts, **overrides)
    text = orjson.dumps(bench.run(opts, log=_log), option=orjson.OPT_INDENT_2).decode()
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    print(text)
    return 0


def add_pipeline_parser(sub: Any) -> None:
    pipeline = sub.add_parser("pipeline", help="Spark pipelines (needs the spark extra)")
    psub = pipeline.add_subparsers(dest="pipeline_name", required=True)
    p = psub.add_parser("metering", help="usage records (ORBIT_SYS_USAGE) → billing aggregates in PostgreSQL")
    p.add_argument("--namesrv", required=True, help="name server address(es), host:port;host:port")
    p.add_argument("--database-url", help="postgresql://... (default: $DATABASE_URL)")
    p.add_argument("--checkpoint", required=True, help="the Spark checkpoint directory (keep it across restarts)")
    p.add_argument("--pipeline", default="usage-metering", help="name of this pipeline's offsets in PostgreSQL")
    p.add_argument("--trigger-interval-s", type=float, default=10.0, help="seconds between micro-batches")
    p.add_argument("--max-messages-per-trigger", type=int, default=100_000)
    p.add_argument("--available-now", action="store_true", help="read what is there now, then stop")
    p.add_argument("--master", default="local[2]", help="the Spark master (default local[2])")
    p.add_argument("--credentials-file", help="an operator's JSON credential (access_key, secret), with --token-url")
    p.add_argument("--token-url", help="the control plane's token endpoint, e.g. http://127.0.0.1:8080/oauth/token")
    p.set_defaults(func=_metering)


def add_bench_parser(bench_sub: Any) -> None:
    b = bench_sub.add_parser("spark", help='format("orbit") streaming read and write throughput, in local Spark')
    b.add_argument("--quick", action="store_true", help="20,000 messages")
    b.add_argument("--messages", type=int)
    b.add_argument("--message-bytes", type=int)
    b.add_argument("--queues", type=int)
    b.add_argument("--spark-cores", type=int, help="local[N] (default 2)")
    b.add_argument("--max-messages-per-trigger", type=int, help="admission control of the streaming queries")
    b.add_argument("--dir", help="cluster directory (default: a new temporary directory)")
    b.add_argument("--out", help="also write the JSON here")
    b.set_defaults(func=_bench_spark)
