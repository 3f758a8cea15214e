"""NameServer: the route table behind a RemotingServer, and the ``orbit namesrv`` process.

* ``NameServer`` serves the processors of ``processor.py`` over one ``RemotingServer``, runs the
  eviction scan every ``scan_interval_s`` (brokers silent for more than ``broker_expiry_s`` go,
  and their connection is closed once no live broker uses it), and removes the brokers of a
  connection the moment it closes.
* ``serve`` runs one until SIGTERM or SIGINT. Once it listens it writes the ready file
  ``{"address": "host:port", "pid": N}`` atomically (temporary file, then ``os.replace``).
* ``main(argv)``: ``--listen HOST:PORT`` (default 127.0.0.1:9876), ``--ready-file``,
  ``--broker-expiry-s``, ``--scan-interval-s``, ``--idle-timeout-s``; ``--tenancy`` with
  ``--control-plane-url`` (its JWKS verifies tokens) and ``--state-dir`` (the access keys and the
  fleet the control plane sends, kept across restarts) puts ``guard.py``'s checks ahead of every
  handler. The inbound limits of ``data_plane/remoting/limits.py`` are flags too
  (``--max-partial-frame-bytes-total``, ``--max-first-frame-bytes``,
  ``--max-large-first-frame-bytes-total``, ``--frame-complete-timeout-ms``,
  ``--max-connections-per-address``, ``--max-connections-total``). uvloop when importable; logs
  go to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Sequence

import orjson

from data_plane.auth import AuthConfig, Authorizer
from data_plane.namesrv.guard import NamesrvGuard
from data_plane.namesrv.processor import NamesrvProcessor
from data_plane.namesrv.route_info import BROKER_EXPIRY_S, RouteInfoManager
from data_plane.remoting import limits as inbound
from data_plane.remoting.codes import RequestCode
from data_plane.remoting.command import MAX_FRAME_BYTES
from data_plane.remoting.connection import IDLE_TIMEOUT_S, Connection
from data_plane.remoting.server import Processors, RemotingServer
from data_plane.tasks import cancel_all
from data_plane.tls import TLS_MODES, ServerTls, TlsConfigError

log = logging.getLogger(__name__)

DEFAULT_PORT = 9876
SCAN_INTERVAL_S = 10.0


class NameServer:
    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        broker_expiry_s: float = BROKER_EXPIRY_S,
        scan_interval_s: float = SCAN_INTERVAL_S,
        idle_timeout_s: float = IDLE_TIMEOUT_S,
        tenancy: bool = False,
        auth: AuthConfig | None = None,
        state_dir: str | None = None,
        limits: inbound.InboundLimits | None = None,
        tls: ServerTls | None = None,
    ) -> None:
        """``tenancy``: a multi-tenant cluster's name server; ``auth`` (enabled, with a JWKS URL
        and the credential store's paths) is then required: see ``guard.py``."""
        if broker_expiry_s <= 0 or scan_interval_s <= 0:
            raise ValueError("broker_expiry_s and scan_interval_s must be positive")
        self.broker_expiry_s = broker_expiry_s
        self.scan_interval_s = scan_interval_s
        self.route_info = RouteInfoManager()
        self.guard: NamesrvGuard | None = None
        if tenancy:
            if auth is None or not auth.enabled:
                raise ValueError("a multi-tenant name server checks credentials: give it an enabled AuthConfig")
            self.guard = NamesrvGuard(Authorizer.from_config(auth.validate()), state_dir=state_dir)
        self.processor = NamesrvProcessor(self.route_info, tenancy=tenancy)
        processors = Processors()
        self.processor.register_on(processors)
        if self.guard is not None:
            processors.before = self.guard.before
            processors.register(RequestCode.ORBIT_SYNC_TENANCY, self.guard.sync)
        self.remoting = RemotingServer(
            processors,
            host=host,
            port=port,
            idle_timeout_s=idle_timeout_s,
            on_close=self._on_close,
            limits=limits,
            tls=tls,
        )
        self._scan_task: asyncio.Task[None] | None = None

    @property
    def address(self) -> str:
        return self.remoting.address

    async def start(self) -> None:
        if self.guard is not None:
            await self.guard.start()
        await self.remoting.start()
        self._scan_task = asyncio.create_task(self._scan_loop(), name="namesrv-scan-not-active")
        log.info("name server listening on %s", self.address)

    async def close(self) -> None:
        task, self._scan_task = self._scan_task, None
        if task is not None:
            await cancel_all([task])
        await self.remoting.close()
        if self.guard is not None:
            await self.guard.stop()

    def _on_close(self, conn: Connection) -> None:
        self.processor.connection_closed(conn)

    def scan_not_active(self) -> None:
        """One eviction round: drop silent brokers and close connections nobody live uses."""
        for _addr, conn_id in self.route_info.scan_not_active(self.broker_expiry_s):
            if conn_id is not None and not self.route_info.has_connection(conn_id):
                conn = self.processor.connections.get(conn_id)
                if conn is not None:
                    conn.close()

    async def _scan_loop(self) -> None:
        while True:
            await asyncio.sleep(self.scan_interval_s)
            try:
                self.scan_not_active()
            except Exception:
                log.exception("the eviction scan failed")


def write_ready_file(path: str, info: dict[str, object]) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "wb") as f:
        f.write(orjson.dumps(info))
    os.replace(tmp, path)


async def serve(
    *,
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    ready_file: str | None = None,
    broker_expiry_s: float = BROKER_EXPIRY_S,
    scan_interval_s: float = SCAN_INTERVAL_S,
    idle_timeout_s: float = IDLE_TIMEOUT_S,
    tenancy: bool = False,
    auth: AuthConfig | None = None,
    state_dir: str | None = None,
    limits: inbound.InboundLimits | None = None,
    tls: ServerTls | None = None,
) -> None:
    """Run a name server until SIGTERM or SIGINT, then close it."""
    server = NameServer(
        host=host,
        port=port,
        broker_expiry_s=broker_expiry_s,
        scan_interval_s=scan_interval_s,
        idle_timeout_s=idle_timeout_s,
        tenancy=tenancy,
        auth=auth,
        state_dir=state_dir,
        limits=limits,
        tls=tls,
    )
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    signals = (signal.SIGTERM, signal.SIGINT)
    for sig in signals:
        loop.add_signal_handler(sig, stop.set)
    try:
        await server.start()
        try:
            if ready_file:
                write_ready_file(ready_file, {"address": server.address, "pid": os.getpid()})
            await stop.wait()
            log.info("name server %s stopping", server.address)
        finally:
            await server.close()
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)


def _listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise argparse.ArgumentTypeError(f"{value!r} is not HOST:PORT")
    return host, int(port)


def _positive(value: str) -> float:
    try:
        f = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number") from None
    if not f > 0:
        raise argparse.ArgumentTypeError(f"{value!r} is not positive")
    return f


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="orbit namesrv", description="The Orbit name server (RocketMQ 4.x protocol).")
    p.add_argument(
        "--listen", type=_listen, default=("127.0.0.1", DEFAULT_PORT), metavar="HOST:PORT", help="port 0: any free port"
    )
    p.add_argument("--ready-file", help="write {address, pid} here (atomically) once serving")
    p.add_argument("--broker-expiry-s", type=_positive, default=BROKER_EXPIRY_S, help="evict brokers silent longer")
    p.add_argument("--scan-interval-s", type=_positive, default=SCAN_INTERVAL_S, help="seconds between eviction scans")
    p.add_argument("--idle-timeout-s", type=float, default=IDLE_TIMEOUT_S, help="close idle connections (0: never)")
    p.add_argument(
        "--tenancy",
        action="store_true",
        help="multi-tenant cluster: every request needs a credential (needs --control-plane-url and --state-dir)",
    )
    p.add_argument("--control-plane-url", default="", help="with --tenancy: the control plane (JWKS)")
    p.add_argument("--state-dir", default="", help="with --tenancy: keeps the access keys and fleet it is sent")
    inbound.add_arguments(p)
    p.add_argument("--tls-mode", choices=TLS_MODES, default="disabled", help="permissive: TLS and plain on one port")
    p.add_argument("--tls-cert", default="", help="the certificate chain (PEM), with --tls-mode")
    p.add_argument("--tls-key", default="", help="its private key (PEM)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    host, port = args.listen
    limits = inbound.from_arguments(args)
    tls = ServerTls(args.tls_mode, args.tls_cert, args.tls_key)
    try:
        tls.validate().context()
    except TlsConfigError as e:
        log.error("orbit namesrv: %s", e)
        return 2
    if problems := limits.problems(MAX_FRAME_BYTES):
        log.error("orbit namesrv: %s", "; ".join(problems))
        return 2
    auth = None
    if args.tenancy:
        if not args.control_plane_url or not args.state_dir:
            log.error("orbit namesrv --tenancy needs --control-plane-url and --state-dir (it checks credentials)")
            return 2
        jwks_url = args.control_plane_url.rstrip("/") + "/.well-known/jwks.json"
        auth = AuthConfig.for_store_dir(args.state_dir, enabled=True, jwks_url=jwks_url)
    coro = serve(
        host=host,
        port=port,
        ready_file=args.ready_file,
        broker_expiry_s=args.broker_expiry_s,
        scan_interval_s=args.scan_interval_s,
        idle_timeout_s=args.idle_timeout_s,
        tenancy=args.tenancy,
        auth=auth,
        state_dir=args.state_dir or None,
        limits=limits,
        tls=tls,
    )
    try:
        import uvloop
    except ImportError:
        loop_factory = None
    else:
        loop_factory = uvloop.new_event_loop
    try:
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            runner.run(coro)
    except OSError as e:
        log.error("name server failed: %s", e)
        return 1
    return 0
