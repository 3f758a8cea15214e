"""``orbit loadtest``: run a scenario (a shipped one by name, a TOML file, or flags), or merge
the results of several generators.

    orbit loadtest --list                                  the shipped scenarios
    orbit loadtest --scenario steady --out DIR             run it on a local cluster (+ its peers)
    orbit loadtest --scenario my.toml --rate-msgs-per-s 2000 --duration-s 30   flags override the file
    orbit loadtest --scenario steady --namesrv HOST:PORT --credentials-file F [--token-url URL]
                   --role producers --out DIR              generator only, against a remote cluster
    orbit loadtest merge a/result.json b/result.json --out DIR

Writes DIR/result.json (schema ``orbit-loadtest/1``), PNG plots and DIR/report.html; prints a
short table. Exit code 0 when every Orbit case ran, 1 when one did not, 2 for a bad scenario or
flag. Heavy imports happen inside the handlers, so ``orbit --help`` stays fast.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from typing import Any

from loadtest.scenario import BROKER_ROLES, FLUSH_TYPES

# flag -> scenario field, for flags that override the scenario's base
OVERRIDES = {
    "producers": int, "consumers": int, "connections": int, "in_flight": int, "batch": int, "topics": int,
    "queues": int, "consumer_groups": int, "keys": int, "consumers_start_after_msgs": int,
    "duration_s": float, "warmup_s": float, "rate_msgs_per_s": float, "drain_timeout_s": float,
}  # fmt: skip


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _size(text: str) -> list[int] | int:
    """``1024`` or ``100-2000`` (uniform between)."""
    lo, sep, hi = text.partition("-")
    try:
        return [int(lo), int(hi)] if sep else int(lo)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected bytes (1024) or a range (100-2000), got {text!r}") from None


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "loadtest",
        help="load tests: scenarios, open-loop load, peers side by side, reports",
        description="Run a load-test scenario and write JSON, PNG plots and an HTML report. See docs/loadtest.md.",
    )
    p.add_argument("--list", action="store_true", help="list the shipped scenarios and exit")
    p.add_argument("--scenario", help="a shipped scenario's name or a TOML file (default: flags only)")
    p.add_argument("--out", help="output directory (default ./loadtest-results/<scenario>-<time>)")
    p.add_argument("--data-dir", help="where servers keep their state (default: a temporary directory)")
    p.add_argument("--case", action="append", default=[], help="run only this case (repeatable)")
    p.add_argument("--no-peers", action="store_true", help="Orbit only, even if the scenario lists peers")
    p.add_argument("--no-limits", action="store_true", help="skip measuring the disk and loopback limits")
    p.add_argument("--disk-mb", type=int, default=256, help="MiB written to measure the disk (default 256)")
    p.add_argument("--seed", type=int, help="seed for message sizes and contents (printed; default random)")
    p.add_argument("--note", default="", help="what else ran on the machine, kept in the result")
    p.add_argument("--progress", choices=["auto", "on", "off"], default="auto", help="the live line on stderr")
    remote = p.add_argument_group("generator only (a cluster run elsewhere; see docs/loadtest.md)")
    remote.add_argument("--namesrv", help="HOST:PORT of the remote cluster's name server")
    remote.add_argument(
        "--credentials-file",
        default=os.environ.get("ORBIT_CREDENTIALS_FILE"),
        help="JSON file with access_key and secret (default $ORBIT_CREDENTIALS_FILE)",
    )
    remote.add_argument("--token-url", help="OAuth token URL: the SDK's JWT path; without it, AccessKey signing")
    remote.add_argument("--role", choices=["all", "producers", "consumers"], default="all")
    remote.add_argument("--no-create-topics", action="store_true", help="the topics exist already")
    flags = p.add_argument_group("scenario fields (override the scenario's base and every case)")
    for name, kind in OVERRIDES.items():
        flags.add_argument("--" + name.replace("_", "-"), type=kind, dest=f"set_{name}", metavar=name.upper())
    flags.add_argument(
        "--message-bytes", type=_size, dest="set_message_bytes", metavar="BYTES", help="1024 or 100-2000"
    )
    flags.add_argument("--flush", choices=FLUSH_TYPES, dest="set_flush")
    flags.add_argument("--broker-role", choices=BROKER_ROLES, dest="set_broker_role")
    flags.add_argument("--ordered", action="store_const", const=True, dest="set_ordered")
    p.set_defaults(func=main)
    msub = p.add_subparsers(dest="action")
    m = msub.add_parser("merge", help="merge several generators' result.json into one result and report")
    m.add_argument("results", nargs="+", help="result.json files")
    m.add_argument("--out", required=True, help="output directory")
    m.set_defaults(func=merge_main)


def _credentials(args: argparse.Namespace) -> dict[str, str] | None:
    if not args.credentials_file:
        return None
    from data_plane.dev_tenancy import read_credentials

    creds = read_credentials(args.credentials_file)
    if creds is None:
        raise SystemExit(f"orbit loadtest: --credentials-file: {args.credentials_file} has no access_key and secret")
    out = {"access_key": creds[0], "secret": creds[1]}
    if args.token_url:
        out["token_url"] = args.token_url
    return out


def _have(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def main(args: argparse.Namespace) -> int:
    from loadtest import scenario as sc

    if args.list:
        for name, description in sc.shipped():
            print(f"{name:<16} {description}")
        return 0
    overrides = {k[4:]: v for k, v in vars(args).items() if k.startswith("set_") and v is not None}
    try:
        scen = sc.load(args.scenario, overrides=overrides) if args.scenario else sc.parse({}, overrides=overrides)
    except sc.ScenarioError as e:
        print(f"orbit loadtest: {e}", file=sys.stderr)
        return 2
    unknown = sorted(set(args.case) - {c.name for c in scen.cases})
    if unknown:
        print(f"orbit loadtest: --case: {unknown[0]!r} is not a case of {scen.name} "
              f"({', '.join(c.name for c in scen.cases)})", file=sys.stderr)  # fmt: skip
        return 2
    if args.namesrv is not None and (":" not in args.namesrv or not args.namesrv.rpartition(":")[2].isdigit()):
        print(f"orbit loadtest: --namesrv: expected HOST:PORT, got {args.namesrv!r}", file=sys.stderr)
        return 2
    if args.role != "all" and args.namesrv is None:
        print("orbit loadtest: --role: only with --namesrv (generator-only mode)", file=sys.stderr)
        return 2
    if not 1 <= args.disk_mb <= 65_536:
        print("orbit loadtest: --disk-mb: expected 1 .. 65536", file=sys.stderr)
        return 2
    from loadtest import machine_limits, report, runner

    if not _have("matplotlib"):
        _log("orbit loadtest: matplotlib is missing, so no plots: install the loadtest extra "
             "(scripts/venv.sh loadtest)")  # fmt: skip
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**31)
    _log(f"orbit loadtest: scenario {scen.name} ({len(scen.cases)} case(s)), seed {seed}")
    remote = None
    if args.namesrv:
        remote = {"kind": "orbit", "namesrv": args.namesrv, "credentials": _credentials(args)}
    out_dir = args.out or os.path.join("loadtest-results", f"{scen.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    limits = None
    if not args.no_limits:
        probe_dir = args.data_dir or out_dir
        _log(f"measuring the machine's limits (disk under {probe_dir}, loopback TCP)")
        limits = machine_limits.measure(probe_dir, disk_mb=args.disk_mb)
        _log(f"  {json.dumps(limits)}")
    opts = runner.RunOptions(
        data_dir=args.data_dir,
        run_peers=not args.no_peers,
        remote=remote,
        create_topics=not args.no_create_topics,
        role=args.role,
        only_cases=tuple(args.case),
        seed=seed,
        show_progress={"auto": None, "on": True, "off": False}[args.progress],
    )
    doc = runner.run(scen, opts, log=_log)
    report.finish(doc, limits=limits, note=args.note)
    files = report.write(doc, out_dir, plots=_have("matplotlib"))
    print(report.summary_text(doc))
    print(f"results: {files['json']}  report: {files['html']}")
    failed = [c for c in doc["cases"] if c["target"] == "orbit" and c.get("status") != "ok"]
    return 1 if failed else 0


def merge_main(args: argparse.Namespace) -> int:
    from loadtest import merge, report

    docs, sources = [], []
    for path in args.results:
        try:
            with open(path, "rb") as f:
                docs.append(json.load(f))
        except (OSError, ValueError) as e:
            print(f"orbit loadtest merge: {path}: cannot read a result: {e}", file=sys.stderr)
            return 2
        sources.append(path)
    try:
        doc = merge.merge_results(docs, sources=sources)
    except merge.MergeError as e:
        print(f"orbit loadtest merge: {e}", file=sys.stderr)
        return 2
    report.finish(doc, limits=None, note="merged from " + ", ".join(sources))
    files = report.write(doc, args.out, plots=_have("matplotlib"))
    print(report.summary_text(doc))
    print(f"results: {files['json']}  report: {files['html']}")
    return 0
