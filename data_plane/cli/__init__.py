"""The ``orbit`` command line.

orbit namesrv [--listen HOST:PORT]                     a name server
orbit broker [--config FILE] [flags]                   a broker
orbit bench store [--quick] [--dir DIR] [--out FILE]   store benchmark, JSON on stdout
orbit bench e2e [--quick] [--latency-first] [--runs N] [--out FILE]  end-to-end benchmark, JSON
orbit bench ha [--quick] [--out FILE]                  SYNC vs ASYNC master, slave catch-up
orbit bench partitions --schedules N [--seed S] [--out FILE|DIR]  seeded cuts, heals, kill -9 on a group
orbit bench tier [--quick] [--seed S] [--out FILE|DIR]  tiered storage: offload, cold reads (moto as S3)
orbit bench spark [--quick] [--out FILE]               format("orbit") streaming throughput (spark extra)
orbit pipeline metering --namesrv A --checkpoint DIR   usage → billing aggregates on Spark (spark extra)
orbit topic|produce|consume|message|group ...          cluster operations (see --help)
orbit dlq list|get|resend GROUP ...                    a consumer group's dead-letter queue
orbit dev up [--dir DIR]                               the local cluster (see README)
orbit loadtest --list | --scenario S [--out DIR] | merge A.json B.json --out DIR   load tests
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import orjson

from data_plane.cli import admin, dev, dlq, servers, spark
from loadtest import cli as loadtest_cli

MAX_BENCH_RUNS = 100
MAX_WARM_MEMORY_MB = 4096
MAX_BENCH_MESSAGES = 100_000_000
MAX_BENCH_SECONDS = 3600.0
N = TypeVar("N", int, float)


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _save(result: dict[str, Any], out: str | None, benchmark: str = "bench") -> str:
    """The result as indented JSON, also written to ``out`` when given (a file, or a directory
    to write ``<benchmark>-<time>-<commit>.json`` into)."""
    from benchmarks.output import result_path

    text = orjson.dumps(result, option=orjson.OPT_INDENT_2).decode()
    out = result_path(out, benchmark)
    if out:
        with open(out, "w") as f:
            f.write(text + "\n")
    return text


def _bench_store(args: argparse.Namespace) -> int:
    from benchmarks import store as bench

    opts = bench.BenchOptions.quick(args.dir) if args.quick else bench.BenchOptions(directory=args.dir)
    overrides: dict[str, Any] = {
        name: getattr(args, name, None)
        for name in ("messages", "queue_messages", "sync_seconds", "rss_gb", "disk_mb", "repeats")
        if getattr(args, name, None) is not None
    }
    if overrides:
        opts = dataclasses.replace(opts, **overrides)
    result = bench.run(opts, log=_log)
    _save(result, args.out)
    summary = {k: v for k, v in result.items() if k != "rss"}
    summary["rss"] = {k: v for k, v in result["rss"].items() if k != "samples"}
    print(orjson.dumps(summary, option=orjson.OPT_INDENT_2).decode())
    return 0


def _whole(flag: str, low: int, high: int) -> Callable[[str], int]:
    """An argparse type: a whole number in [low, high], or a clear error naming ``flag``."""
    return _bounded(flag, low, high, int, "a whole number")


def _amount(flag: str, low: float, high: float) -> Callable[[str], float]:
    """An argparse type: a number in [low, high] (not NaN or infinite), or a clear error."""
    return _bounded(flag, low, high, float, "a number")


def _bounded(flag: str, low: N, high: N, convert: Callable[[str], N], what: str) -> Callable[[str], N]:
    def parse(text: str) -> N:
        try:
            x = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} takes {what}, not {text!r}") from None
        if not low <= x <= high:  # (NaN fails both comparisons)
            shown = (str(b) if isinstance(b, int) else f"{b:g}" for b in (low, high))
            raise argparse.ArgumentTypeError(f"{flag} must be {'..'.join(shown)}, not {text}")
        return x

    return parse


def _bench_e2e(args: argparse.Namespace) -> int:
    from loadtest import e2e, verdict

    opts = e2e.E2EOptions.quick(args.dir) if args.quick else e2e.E2EOptions(directory=args.dir)
    if args.seconds:
        opts = dataclasses.replace(opts, seconds=args.seconds)
    if args.pull_batch_size:
        opts = dataclasses.replace(opts, pull_batch_size=args.pull_batch_size)
    if args.latency_first:
        opts = dataclasses.replace(opts, latency_first=True)
    if args.warm_memory_mb is not None:
        opts = dataclasses.replace(opts, warm_memory_mb=args.warm_memory_mb)
    if args.no_grpc:
        opts = dataclasses.replace(opts, grpc=False)
    if args.tls:
        try:
            compared = e2e.compare_tls(opts, log=_log, pairs=args.runs)
        except e2e.BenchDirectoryError as e:
            _log(f"orbit bench e2e: {e}")
            return 2
        print(_save(compared, args.out, "e2e-tls"))
        return 0
    if args.runs == 1:
        try:
            result = e2e.run(opts, log=_log)
        except e2e.BenchDirectoryError as e:
            _log(f"orbit bench e2e: {e}")
            return 2
        print(_save(result, args.out, "e2e"))
        return 0
    results: list[dict[str, Any]] = []
    for i in range(1, args.runs + 1):
        _log(f"run {i} of {args.runs}")
        # each run on a fresh cluster: its own directory under --dir, or a temporary one
        own = opts if opts.directory is None else dataclasses.replace(opts, directory=f"{opts.directory}/run-{i}")
        try:
            results.append(e2e.run(own, log=_log))
        except Exception as e:  # (its cluster did not start, a worker died): the other runs still count
            results.append({"error": f"{type(e).__name__}: {e}"})
            _log(f"run {i} failed: {results[-1]['error']}")
            continue
        _log(f"run {i}: {verdict.missed(results[-1])}")
    over_runs = verdict.summarize(results)
    summary = {"summary": over_runs, "runs": [verdict.brief(r) for r in results]}
    text = _save(summary, None)
    if args.out:
        _save({**summary, "results": results}, args.out)
    print(text)
    return 1 if over_runs["failed_runs"] else 0


def _bench_ha(args: argparse.Namespace) -> int:
    from benchmarks import ha as ha_bench

    opts = ha_bench.HaBenchOptions.quick() if args.quick else ha_bench.HaBenchOptions()
    if args.seconds:
        opts = dataclasses.replace(opts, seconds=args.seconds)
    if args.catch_up_mb:
        opts = dataclasses.replace(opts, catch_up_mb=args.catch_up_mb)
    print(_save(ha_bench.run(opts, log=_log), args.out))
    return 0


def _bench_partitions(args: argparse.Namespace) -> int:
    from benchmarks import partitions

    return partitions.run_command(args)


def _bench_tier(args: argparse.Namespace) -> int:
    from benchmarks import tier

    return tier.run_command(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="orbit", description="Orbit: a managed message queue.")
    sub = parser.add_subparsers(dest="command", required=True)
    servers.add_namesrv_parser(sub)
    servers.add_broker_parser(sub)
    servers.add_proxy_parser(sub)
    servers.add_control_plane_parser(sub)
    bench = sub.add_parser("bench", help="benchmarks")
    bench_sub = bench.add_subparsers(dest="what", required=True)
    store = bench_sub.add_parser("store", help="the message store, in-process")
    store.add_argument("--quick", action="store_true", help="smaller amounts (about a minute)")
    store.add_argument("--dir", help="store directory (default: a new temporary directory)")
    store.add_argument("--out", help="also write the full JSON (with RSS samples) here")
    store.add_argument(
        "--messages", type=_whole("--messages", 1, MAX_BENCH_MESSAGES), help="messages per append figure"
    )
    store.add_argument(
        "--queue-messages",
        type=_whole("--queue-messages", 1, MAX_BENCH_MESSAGES),
        help="messages for each of the 16 / 10,000 queue runs",
    )
    store.add_argument(
        "--sync-seconds", type=_amount("--sync-seconds", 0.1, MAX_BENCH_SECONDS), help="seconds of SYNC_FLUSH load"
    )
    store.add_argument(
        "--rss-gb", type=_amount("--rss-gb", 0.01, 1024), help="GiB to write while watching resident memory"
    )
    store.add_argument(
        "--disk-mb", type=_whole("--disk-mb", 1, 1 << 20), help="MiB written to measure the disk's bandwidth"
    )
    store.add_argument(
        "--repeats",
        type=_whole("--repeats", 1, MAX_BENCH_RUNS),
        help="runs of each figure; the median is reported (default 3)",
    )
    store.set_defaults(func=_bench_store)
    e2e = bench_sub.add_parser("e2e", help="producers and consumers against one broker, over loopback")
    e2e.add_argument("--quick", action="store_true", help="3-second phases")
    e2e.add_argument("--dir", help="cluster directory (default: a new temporary directory)")
    e2e.add_argument(
        "--seconds", type=_amount("--seconds", 0.1, MAX_BENCH_SECONDS), help="length of each publishing phase"
    )
    e2e.add_argument(
        "--pull-batch-size",
        type=_whole("--pull-batch-size", 1, 1024),
        help="messages a consumer asks for in one pull (default 128)",
    )
    e2e.add_argument(
        "--latency-first",
        action="store_true",
        help="the synchronous and half-peak phases first, on a fresh broker, then batched and consume",
    )
    e2e.add_argument(
        "--warm-memory-mb",
        type=_whole("--warm-memory-mb", 0, MAX_WARM_MEMORY_MB),
        help="before the cluster starts, write and free 4x this many MiB of page cache, so that a VM's "
        "cold memory does not slow the first phases (default 1024, --quick 64; 0: do not)",
    )
    e2e.add_argument(
        "--runs",
        type=_whole("--runs", 1, MAX_BENCH_RUNS),
        default=1,
        help="run the whole benchmark this many times, each on a fresh cluster, and print how many runs "
        "met each target with its median, lowest and highest figure (default 1: one run's JSON)",
    )
    e2e.add_argument(
        "--tls",
        action="store_true",
        help="run it plain, then with every connection over TLS, and report each throughput's TLS/plain ratio "
        "(with --runs N: N such pairs, the order alternating, and the median ratios)",
    )
    e2e.add_argument(
        "--no-grpc", action="store_true", help="leave out the RocketMQ 5 gRPC endpoint's phases (docs/rocketmq5.md)"
    )
    e2e.add_argument("--out", help="also write the JSON here (with --runs: every run's full result too)")
    e2e.set_defaults(func=_bench_e2e)
    ha = bench_sub.add_parser("ha", help="SYNC_MASTER vs ASYNC_MASTER publishing and slave catch-up, on a real group")
    ha.add_argument("--quick", action="store_true", help="3-second phases, 128 MiB catch-up")
    ha.add_argument(
        "--seconds", type=_amount("--seconds", 0.1, MAX_BENCH_SECONDS), help="length of each publishing phase"
    )
    ha.add_argument("--catch-up-mb", type=_whole("--catch-up-mb", 1, 1 << 20), help="MiB the slave catches up")
    ha.add_argument("--out", help="also write the JSON here")
    ha.set_defaults(func=_bench_ha)
    pt = bench_sub.add_parser(
        "partitions", help="seeded schedules of cuts, heals and kill -9 on a broker group with failover (JSON)"
    )
    pt.add_argument(
        "--schedules", type=_whole("--schedules", 1, 1000), default=10, help="seeded schedules to run (default 10)"
    )
    pt.add_argument("--seed", type=int, help="the first schedule's seed (default: a random one, printed)")
    pt.add_argument("--lease-s", type=_amount("--lease-s", 1.0, 300.0), default=6.0, help="failover_lease_s (6)")
    pt.add_argument(
        "--check-s", type=_amount("--check-s", 0.1, 100.0), default=1.0, help="failover_check_interval_s (1)"
    )
    pt.add_argument("--out", help="also write the JSON here; a directory: partitions-<UTC time>-<git hash>.json in it")
    pt.set_defaults(func=_bench_partitions)
    tier = bench_sub.add_parser(
        "tier", help="tiered storage on real processes: offload rate and send latency, cold reads, lost (JSON)"
    )
    tier.add_argument("--quick", action="store_true", help="one round of 4-second phases, 128 MiB read (a minute)")
    tier.add_argument("--seed", type=int, help="the bodies' and offsets' seed (default: a random one, printed)")
    tier.add_argument(
        "--rounds",
        type=_whole("--rounds", 0, 20),
        help="rounds of offload phases, the object store under SCHED_IDLE (2; quick 1)",
    )
    tier.add_argument(
        "--colocated-rounds",
        type=_whole("--colocated-rounds", 0, 20),
        help="rounds of offload phases before those, the object store at the broker's priority (1)",
    )
    tier.add_argument(
        "--seconds", type=_amount("--seconds", 1, 600), help="measured seconds of each offload phase (10; --quick 4)"
    )
    tier.add_argument("--rate", type=_whole("--rate", 100, 50_000), help="paced sends a second (3000)")
    tier.add_argument("--read-mb", type=_whole("--read-mb", 8, 16_384), help="MiB read back (320; --quick 128)")
    tier.add_argument(
        "--chunk-mb", type=_amount("--chunk-mb", 0.004, 64), help="the broker's tier_read_chunk_bytes, MiB (4)"
    )
    tier.add_argument(
        "--read-ahead", type=_whole("--read-ahead", 0, 64), help="the broker's tier_read_ahead_chunks (4)"
    )
    tier.add_argument(
        "--upload-mb-s",
        type=_amount("--upload-mb-s", 1.1, 100_000),
        help="pace uploads to this many MB/s (the broker's tier_upload_bytes_per_s; default: no limit)",
    )
    tier.add_argument("--dir", help="the cluster's directory, kept (default: a temporary one, removed)")
    tier.add_argument("--out", help="also write the JSON here; a directory: tier-<UTC time>-<git hash>.json in it")
    tier.set_defaults(func=_bench_tier)
    spark.add_bench_parser(bench_sub)
    dev.add_parser(sub)
    admin.add_parsers(sub)
    dlq.add_parser(sub)
    loadtest_cli.add_parser(sub)
    spark.add_pipeline_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
