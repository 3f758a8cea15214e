"""``orbit namesrv`` and ``orbit broker``: run one server process in the foreground.

Both bind their ``--listen`` address (port 0 picks a free port), print it, write it to
``--ready-file`` as JSON once they serve, and stop cleanly on SIGTERM / Ctrl-C."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import sys
from typing import Any

from data_plane.broker import config as broker_config


def run_loop(coro: Any) -> int:
    try:
        import uvloop
    except ImportError:
        return int(asyncio.run(coro))
    return int(uvloop.run(coro))


def setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def parse_value(text: str) -> Any:
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _pairs(items: list[str] | None, what: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise broker_config.ConfigError(f"{what} {item!r} is not key=value")
        out[key.strip().replace("-", "_")] = parse_value(value.strip())
    return out


def add_control_plane_parser(sub: Any) -> None:
    p = sub.add_parser(
        "control-plane",
        help="run the control plane (HTTP API; options: orbit control-plane --help)",
        add_help=False,
        prefix_chars="\0",  # every argument goes through to the control plane's own parser
    )
    p.add_argument("args", nargs=argparse.REMAINDER)
    p.set_defaults(func=lambda a: _control_plane_main(a.args))


def _control_plane_main(argv: list[str]) -> int:
    from control_plane.server import main

    return main(argv)


def add_broker_parser(sub: Any) -> None:
    p = sub.add_parser("broker", help="run a broker", description=__doc__)
    p.add_argument("--config", help="TOML file of broker settings ([store] table for the store)")
    p.add_argument("--listen", help="host:port to serve clients on (default 127.0.0.1:10911)")
    p.add_argument("--namesrv", action="append", help="name server host:port (repeatable, or ';'-separated)")
    p.add_argument("--broker-name")
    p.add_argument("--cluster", dest="cluster_name")
    p.add_argument("--broker-id", type=int)
    p.add_argument("--role", dest="broker_role", choices=[r.value for r in broker_config.BrokerRole])
    p.add_argument("--store-dir")
    p.add_argument("--advertised-host", help="host published to name servers and clients")
    p.add_argument("--flush", choices=["ASYNC_FLUSH", "SYNC_FLUSH"], help="flush mode of the CommitLog")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="any broker setting")
    p.add_argument("--store-set", action="append", metavar="KEY=VALUE", help="any store setting")
    p.add_argument("--ready-file", help="write {address, pid} here as JSON once serving")
    p.add_argument("--log-level", default="INFO")
    p.set_defaults(func=run_broker)


def load_broker_config(args: argparse.Namespace) -> broker_config.BrokerConfig:
    overrides: dict[str, Any] = _pairs(args.set, "--set")
    for name in ("listen", "broker_name", "cluster_name", "broker_id", "broker_role", "store_dir", "advertised_host"):
        v = getattr(args, name, None)
        if v is not None:
            overrides[name] = v
    if args.namesrv:
        overrides["namesrv_addrs"] = ";".join(args.namesrv)
    store = _pairs(args.store_set, "--store-set")
    if args.flush:
        store["flush_disk_type"] = args.flush
    if store:
        overrides["store"] = store
    return broker_config.load(args.config, overrides)


def run_broker(args: argparse.Namespace) -> int:
    from data_plane.broker.broker import serve

    setup_logging(args.log_level)
    try:
        config = load_broker_config(args)
    except broker_config.ConfigError as e:
        print(f"orbit broker: {e}", file=sys.stderr)
        return 2
    return run_loop(serve(config, args.ready_file))


def add_namesrv_parser(sub: Any) -> None:
    # No option prefix: REMAINDER alone does not take arguments that start with "-", so every
    # argument after "namesrv" goes, untouched, to data_plane.namesrv.server.main.
    p = sub.add_parser("namesrv", help="run a name server", add_help=False, prefix_chars="\x00")
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(func=run_namesrv)


def run_namesrv(args: argparse.Namespace) -> int:
    from data_plane.namesrv.server import main

    return int(main(args.rest))


def add_proxy_parser(sub: Any) -> None:
    p = sub.add_parser(
        "proxy",
        help="run the RocketMQ 5 gRPC endpoint in front of a cluster (docs/rocketmq5.md)",
        description="The RocketMQ 5 clients' gRPC endpoint for a whole cluster: routes from the name servers, "
        "each call forwarded to the broker it concerns, which authenticates the client.",
    )
    p.add_argument("--listen", default="0.0.0.0:8081", help="host:port (port 0: a free one; default 0.0.0.0:8081)")
    p.add_argument("--namesrv", required=True, help="name servers, host:port;host:port")
    p.add_argument(
        "--advertised-host", default="", help="the host clients reach the proxy at (default: the listen host)"
    )
    p.add_argument(
        "--credentials-file",
        help="a broker or operator credential (JSON or TOML: access_key, secret) for the name servers and brokers",
    )
    p.add_argument("--ready-file", help="write {address, pid} here as JSON once serving")
    p.add_argument("--log-level", default="info")
    p.set_defaults(func=run_proxy)


def run_proxy(args: argparse.Namespace) -> int:
    import os

    from data_plane.broker.broker import write_ready_file
    from data_plane.broker.tenancy import load_broker_credentials
    from data_plane.proxy.cluster import serve

    setup_logging(args.log_level)
    host, _, port = args.listen.rpartition(":")
    if not host or not port.isdigit():
        print(f"orbit proxy: --listen {args.listen!r} is not host:port", file=sys.stderr)
        return 2
    namesrv = [a for a in args.namesrv.split(";") if a]
    credential = None
    if args.credentials_file:
        try:
            credential = load_broker_credentials(args.credentials_file)
        except (OSError, ValueError) as e:
            print(f"orbit proxy: {e}", file=sys.stderr)
            return 2
    advertised = args.advertised_host or ("127.0.0.1" if host in ("0.0.0.0", "::") else host)

    def ready(address: str) -> None:
        print(f"proxy listening on {address}", flush=True)
        if args.ready_file:
            write_ready_file(args.ready_file, {"address": address, "pid": os.getpid()})

    return run_loop(_serve_until_stopped(serve(args.listen, namesrv, advertised, credential, ready)))


async def _serve_until_stopped(serving: Any) -> int:
    import signal

    task = asyncio.ensure_future(serving)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, task.cancel)
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return 0
