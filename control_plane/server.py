"""The control-plane process: ``python -m control_plane [flags]``.

    --listen HOST:PORT                 where to serve (port 0: any free port)
    --database-url URL                 PostgreSQL; without it (and without DATABASE_URL) an
                                       embedded PostgreSQL runs under --data-dir
    --data-dir DIR                     embedded PostgreSQL and generated key files
    --master-key-file PATH             base64 master key (created 0600 when missing)
    --bootstrap-credentials-file PATH  first operator credential, written 0600
    --token-lifetime-s N
    --ready-file PATH                  gets {"url": "http://127.0.0.1:PORT"} once serving
    --telemetry none|console|otlp      OpenTelemetry traces and metrics (env ORBIT_TELEMETRY;
                                       otlp: the OTEL_EXPORTER_OTLP_* variables say where)

SIGTERM and SIGINT stop it cleanly (server, pool, then the embedded PostgreSQL).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import ssl
import sys
from collections.abc import Sequence

import orjson
from aiohttp import web

from control_plane.app import create_app
from control_plane.postgres import DataDirUnreachable, EmbeddedPostgres, EmbeddedPostgresError, fallback_data_dir
from control_plane.settings import Settings, SettingsError, write_private_file
from data_plane.tls import ServerTls, TlsConfigError

log = logging.getLogger("control_plane")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="orbit control-plane", description="Orbit's control plane (HTTP API)")
    p.add_argument("--listen", help="HOST:PORT (default 127.0.0.1:8080; port 0 picks one)")
    p.add_argument("--database-url", help="PostgreSQL URL (default: $DATABASE_URL, else an embedded PostgreSQL)")
    p.add_argument("--data-dir", default="./orbit-data/control-plane", help="embedded PostgreSQL and key files")
    p.add_argument("--master-key-file", help="base64 master key file (created when missing)")
    p.add_argument("--bootstrap-credentials-file", help="where the first operator credential is written (0600)")
    p.add_argument("--token-lifetime-s", type=int, help="JWT lifetime in seconds (default 900)")
    p.add_argument("--reconcile-interval-s", type=float, help="reconciler round interval (default 5; 0 = off)")
    p.add_argument("--ready-file", help='written with {"url": ...} once serving')
    p.add_argument("--tls-cert", help="serve HTTPS with this certificate chain (PEM; with --tls-key)")
    p.add_argument("--tls-key", help="the certificate's private key (PEM)")
    p.add_argument(
        "--telemetry",
        choices=["none", "console", "otlp"],
        help="OpenTelemetry exporter (default none; env ORBIT_TELEMETRY)",
    )
    return p.parse_args(argv)


async def serve(settings: Settings, *, ready_file: str | None, ssl_context: ssl.SSLContext | None = None) -> None:
    app = create_app(settings)
    runner = web.AppRunner(app, handle_signals=False)
    await runner.setup()
    try:
        site = web.TCPSite(runner, settings.listen_host, settings.listen_port, ssl_context=ssl_context)
        await site.start()
        server = site._server  # the bound port, when port 0 was asked for
        port = server.sockets[0].getsockname()[1] if isinstance(server, asyncio.Server) else settings.listen_port
        host = "127.0.0.1" if settings.listen_host in ("0.0.0.0", "::") else settings.listen_host
        url = f"{'https' if ssl_context is not None else 'http'}://{host}:{port}"
        log.info("control plane serving on %s", url)
        if ready_file:
            write_private_file(ready_file, orjson.dumps({"url": url}).decode() + "\n")
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
    finally:
        await runner.cleanup()


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    data_dir = os.path.abspath(args.data_dir)
    embedded: EmbeddedPostgres | None = None
    try:
        env_url = os.environ.get("DATABASE_URL")
        database_url = args.database_url or env_url
        if not database_url:
            embedded = EmbeddedPostgres(os.path.join(data_dir, "postgres"))
            try:
                embedded.start()
            except DataDirUnreachable:
                embedded = EmbeddedPostgres(fallback_data_dir(embedded.data_dir))
                log.info("the postgres user cannot reach %s; PostgreSQL data goes to %s", data_dir, embedded.data_dir)
                embedded.start()
            database_url = embedded.create_database("orbit")
            log.info("embedded PostgreSQL on port %d (data in %s)", embedded.port, embedded.data_dir)
        key_file = args.master_key_file
        if not key_file and not os.environ.get("ORBIT_MASTER_KEY") and not os.environ.get("ORBIT_MASTER_KEY_FILE"):
            key_file = os.path.join(data_dir, "master.key")  # the dev path: generated on first start
        settings = Settings.from_env(
            master_key_file=key_file,
            create_master_key=True,
            listen=args.listen,
            database_url=database_url,
            bootstrap_credentials_file=args.bootstrap_credentials_file,
            token_lifetime_s=args.token_lifetime_s,
            reconcile_interval_s=args.reconcile_interval_s,
            telemetry=args.telemetry,
        )
        if bool(args.tls_cert) != bool(args.tls_key):
            raise TlsConfigError("--tls-cert and --tls-key go together")
        tls = ServerTls("enforcing", args.tls_cert, args.tls_key) if args.tls_cert else ServerTls()
        asyncio.run(serve(settings, ready_file=args.ready_file, ssl_context=tls.validate().context()))
    except (SettingsError, EmbeddedPostgresError, TlsConfigError) as e:
        print(f"control plane: {e}", file=sys.stderr)
        return 2
    finally:
        if embedded is not None:
            with contextlib.suppress(Exception):
                embedded.stop()
    return 0
