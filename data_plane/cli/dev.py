"""``orbit dev up``: the local cluster — the control plane (with an embedded PostgreSQL), a name
server and a broker with authentication on, as child processes, with every byte of state under
one directory (``--dir``, default ``./orbit-data``). ``--no-tenancy`` runs just the name server
and an open broker.

It prints the endpoints and working credentials (a demo tenant's, for the SDK and for a stock
RocketMQ client) once everything serves, keeps running until Ctrl-C / SIGTERM, then stops the
broker first (it unregisters and flushes), the name server and the control plane last. If a child
dies, the others are stopped and the exit code is non-zero. With no ``DATABASE_URL`` the control
plane runs its own PostgreSQL; set it to use an external one."""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import time
from typing import Any

from data_plane.dev_tenancy import BootstrapError, Demo
from data_plane.group_ports import MAX_BROKER_GROUPS
from data_plane.local_cluster import ClusterError, LocalCluster


def _print_demo(namesrv: str, url: str, demo: Demo, grpc: str) -> None:
    """Working credentials for the demo tenant — the secret is printed here, to the developer's
    own terminal, once per run; it also sits in a 0600 file under the data directory."""
    print(f"Demo tenant {demo.tenant!r}: topic {demo.topic!r}, consumer group {demo.group!r}")
    print(f"  access key    {demo.access_key}")
    print(f"  secret        {demo.secret}")
    print(f"  (also in {demo.credentials_file})")
    print("CLI (signs with the access key):")
    print(f"  export ORBIT_NAMESRV={namesrv} ORBIT_CREDENTIALS_FILE={demo.credentials_file}")
    print(f"  orbit produce --topic '{demo.topic}' --body hello")
    print(f"  orbit consume --topic '{demo.topic}' --group '{demo.group}' --earliest --max 1")
    print("SDK (OAuth client credentials -> JWT):")
    print("  from sdk import Producer; from sdk.credentials import ClientCredentials")
    print(f"  creds = ClientCredentials('{demo.access_key}', '<secret>', '{url}/oauth/token')")
    print(f"  Producer('my-producer', namesrv_addrs='{namesrv}', credentials=creds)")
    print("Stock RocketMQ client (ACL signature): AccessKey / SecretKey above, name server as above.")
    if grpc:
        topic, group = demo.topic.partition("%")[2], demo.group.partition("%")[2]
        print(f"RocketMQ 5 clients (gRPC): endpoint {grpc}, namespace '{demo.tenant}', topic '{topic}',")
        print(f"  consumer group '{group}', AccessKey / SecretKey above (plaintext; tls_enable=False)")


_PORT_FLAGS = (
    ("control-plane", "--control-plane-port"),
    ("namesrv", "--namesrv-port"),
    ("broker-a-s", "--slave-port"),  # (before "broker": a slave's name starts like the master's)
    ("broker", "--broker-port"),
)
_IN_USE = re.compile(r"address already in use|Address already in use", re.I)
_BIND = re.compile(r"\('[^']*', (\d+)\)")  # asyncio's "bind on address ('127.0.0.1', 9876)"


def port_in_use(error: str) -> str | None:
    """One line naming the flag to change, when a child could not start because its port is
    taken ("namesrv did not start; the end of …log: … address already in use"), else None."""
    in_use = _IN_USE.search(error)
    if in_use is None:
        return None
    child = error.split(" ", 1)[0]
    flag = next((f for prefix, f in _PORT_FLAGS if child.startswith(prefix)), None)
    if flag is None:
        return None
    found = _BIND.search(error, max(0, in_use.start() - 200))
    port = found.group(1) if found else ""
    where = f"port {port}" if port else "its port"
    return f"{where} of {child} is in use: choose another with {flag} (0 picks a free one)"


DEV_DESCRIPTION = """\
The local development cluster, every part a process on this machine:
  - the control plane (HTTP API, OpenAPI at /openapi.json) on an embedded PostgreSQL,
    with an operator credential and a demo tenant (its credential printed once it is up);
  - a name server;
  - broker group broker-a: a SYNC_MASTER and a slave replicating it, with failover through
    the control plane (--single-broker: one broker; --no-tenancy: no control plane, no
    credentials); --broker-groups N runs N such groups, broker-a, broker-b, ..., each
    registered with the control plane's fleet (each further group on the next free ports
    after the previous group's: with the defaults broker-b on 10931 / 10941);
  - with --tier, an S3-compatible store (moto) the brokers tier sealed CommitLog files to.
State lives under --dir, so a second `dev up` finds its topics and messages again."""


def broker_groups(text: str) -> int:
    """``--broker-groups``: a whole number 1..MAX_BROKER_GROUPS."""
    try:
        n = int(text)
    except ValueError:
        n = 0
    if not 1 <= n <= MAX_BROKER_GROUPS:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of broker groups from 1 to {MAX_BROKER_GROUPS}")
    return n


def add_parser(sub: Any) -> None:
    fmt = argparse.RawDescriptionHelpFormatter
    dev = sub.add_parser("dev", help="the local development cluster", description=DEV_DESCRIPTION, formatter_class=fmt)
    dev_sub = dev.add_subparsers(dest="what", required=True, metavar="{up}")
    up = dev_sub.add_parser(
        "up", help="run the control plane, a name server and a broker group (master + slave) until Ctrl-C",
        description=DEV_DESCRIPTION, formatter_class=fmt,
    )  # fmt: skip
    up.add_argument("--dir", default="orbit-data", help="where all state lives (default: ./orbit-data)")
    up.add_argument("--host", default="127.0.0.1", help="interface to listen on (default: 127.0.0.1)")
    up.add_argument("--namesrv-port", type=int, default=9876, help="name server port (default: 9876; 0: a free port)")
    up.add_argument("--broker-port", type=int, default=10911, help="master's port (default: 10911; 0: a free port)")
    up.add_argument(
        "--slave-port", type=int, default=None,
        help="slave's port (default: the master's + 10, so 10921; 0: a free port)",
    )  # fmt: skip
    up.add_argument(
        "--control-plane-port", type=int, default=8080, help="control plane's HTTP port (default: 8080; 0: a free port)"
    )
    up.add_argument("--no-tenancy", action="store_true", help="no control plane: an open broker, no credentials")
    up.add_argument(
        "--flush", choices=["ASYNC_FLUSH", "SYNC_FLUSH"], default="ASYNC_FLUSH",
        help="when the CommitLog is forced to disk: in the background, or before a send is answered "
        "(default: ASYNC_FLUSH)",
    )  # fmt: skip
    up.add_argument(
        "--single-broker", action="store_true",
        help="one broker instead of a broker group of a SYNC_MASTER and a slave",
    )  # fmt: skip
    up.add_argument(
        "--broker-groups", type=broker_groups, default=1, metavar="N",
        help=f"how many broker groups (broker-a, broker-b, ...; 1..{MAX_BROKER_GROUPS}, default 1); each further "
        "group takes the next free ports after the previous group's",
    )  # fmt: skip
    up.add_argument(
        "--store-set", action="append", default=[], metavar="KEY=VALUE",
        help="a broker store setting, e.g. commit_log_file_size_bytes=67108864 (repeatable)",
    )  # fmt: skip
    up.add_argument(
        "--broker-set", action="append", default=[], metavar="KEY=VALUE",
        help="a broker setting, e.g. usage_topic_enabled=true (the Spark metering pipeline's input; repeatable)",
    )  # fmt: skip
    up.add_argument(
        "--tls", action="store_true",
        help="TLS: a local CA under DIR/tls; name server and brokers take TLS and plain TCP, the control plane HTTPS",
    )  # fmt: skip
    up.add_argument(
        "--tier", action="store_true",
        help="tiered storage: brokers move sealed CommitLog files to a local S3-compatible store (moto, empty at "
        "every start; bucket orbit-tier) and read them back from it",
    )  # fmt: skip
    up.add_argument("--ready-file", help="write the endpoints here as JSON once serving")
    up.set_defaults(func=dev_up)


def dev_up(args: argparse.Namespace) -> int:
    stop_requested = False

    def on_signal(signum: int, frame: object) -> None:
        nonlocal stop_requested
        stop_requested = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    cluster = LocalCluster(
        os.path.abspath(args.dir),
        host=args.host,
        namesrv_port=args.namesrv_port,
        broker_port=args.broker_port,
        slave_port=args.slave_port,
        flush=args.flush,
        broker_flags=[
            *(f for kv in args.store_set for f in ("--store-set", kv)),
            *(f for kv in args.broker_set for f in ("--set", kv)),
        ],
        tenancy=not args.no_tenancy,
        slaves=0 if args.single_broker else 1,
        broker_groups=args.broker_groups,
        control_plane_port=args.control_plane_port,
        tls=args.tls,
        tier=args.tier,
    )
    try:
        cluster.start()
    except (ClusterError, BootstrapError) as e:
        print(f"orbit dev up: {port_in_use(str(e)) or e}", file=sys.stderr)
        return 1
    endpoints = cluster.endpoints()
    if args.ready_file:
        tmp = args.ready_file + ".tmp"
        with open(tmp, "w") as f:
            json.dump(endpoints, f)
        os.replace(tmp, args.ready_file)
    print("Orbit local cluster is up.")
    if cluster.control_plane_url:
        print(f"  control plane {cluster.control_plane_url}  (OpenAPI: {cluster.control_plane_url}/openapi.json)")
        print(f"  operator      credentials in {endpoints['operator_credentials_file']}")
        print(f"  console       {endpoints['console']}  (sign in with the demo tenant's access key and secret below)")
    print(f"  name server   {cluster.namesrv}")
    for name, addr in cluster.brokers.items():
        print(f"  {name:<13} {addr}")
    if cluster.broker_groups > 1:
        fleet = " (each in the control plane's fleet)" if cluster.control_plane_url else ""
        print(f"  broker groups {', '.join(cluster.group_names)}{fleet}")
    if endpoints.get("grpc"):
        print(f"  gRPC (v5)     {endpoints['grpc']}  (RocketMQ 5 clients)")
    if cluster.tls:
        ca = cluster.tls_files["ca.pem"]
        print(f"  TLS           CA {ca}: clients trust it with  export ORBIT_TLS_CA={ca}")
        print("                (the SDK, CLI and Spark connector then connect over TLS and verify; curl --cacert)")
    if endpoints.get("s3"):
        s3, url = endpoints["s3"], endpoints["tier_url"]
        print(f"  S3 (tier)     {s3}  brokers tier to {url}  (moto: its objects go when it stops)")
    print(f"  data          {cluster.root}")
    print(f"  logs          {cluster.run_dir}")
    demo = cluster.demo
    if demo is None:
        print(f"Try:  export ORBIT_NAMESRV={cluster.namesrv}")
        print("      orbit produce --topic demo --body hello && orbit consume --topic demo --earliest --max 1")
    else:
        _print_demo(cluster.namesrv, cluster.control_plane_url, demo, endpoints.get("grpc", ""))
    print("Ctrl-C stops the cluster.", flush=True)
    code = 0
    reported: set[str] = set()
    while not stop_requested:
        dead = cluster.dead()
        for c in dead:
            if c.name not in reported:
                reported.add(c.name)
                print(f"orbit dev up: {c.name} exited with code {c.proc.returncode}; see {c.log_path}", file=sys.stderr)
        # A broker group member may die (the group fails over; restart it with `orbit broker`
        # and the flags in its log's first line); anything else, or every broker, ends the run.
        brokers = set(cluster.brokers)
        if any(c.name not in brokers for c in dead) or (brokers and brokers <= reported):
            code = 1
            break
        time.sleep(0.2)
    print("stopping…", flush=True)
    cluster.stop()
    print("stopped.", flush=True)
    return code
