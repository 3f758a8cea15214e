"""LocalObjectStore: an S3-compatible object store on this machine — moto's S3 server as a
child process on 127.0.0.1 — for tiered storage in ``orbit dev up --tier`` and in tests.

A broker reaches it as it would reach S3: ``[store] tier_endpoint_url`` is ``endpoint_url``,
and the credentials come through the usual AWS chain, from the environment ``environment()``
builds for the broker's process (dummy keys, which moto accepts; the region; no instance
metadata lookups; no ``~/.aws`` files).

Outages, two kinds:
- ``pause()`` / ``resume()`` (SIGSTOP / SIGCONT): unreachable, then back with everything it held.
  While paused the kernel still accepts connections, nobody answers them: clients time out.
- ``stop()`` / ``start()``: gone (connections refused), then back on the same port, but empty:
  moto keeps buckets and objects in memory only, so a restart loses them all.

The child is ``python -m data_plane.local_object_store`` (``serve`` below: moto's S3 app in
werkzeug's server, as ``moto_server`` runs it). It binds the port itself (0: a free one, no
race), then writes ``{"port", "pid"}`` to a ready file. It also holds the read end of a pipe
whose write end only this process has, and exits when that pipe closes, so the server does not
outlive its owner however the owner ends (a paused server cannot notice: an exit handler
resumes and stops it, but a SIGKILLed owner leaves a paused one stopped). Its output goes to
``log_path``.

moto is in the ``dev`` extra (boto3, which ``client()`` uses, is a dependency of Orbit)."""

from __future__ import annotations

import argparse
import atexit
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

ACCESS_KEY_ID = "testing"  # moto takes any credentials; these say they are not real ones
SECRET_ACCESS_KEY = "testing"
DEFAULT_REGION = "us-east-1"
READY_POLL_S = 0.02
SHUTDOWN_POLL_S = 0.05
LISTEN_BACKLOG = 128
CHILD_MODULE = "data_plane.local_object_store"  # this module, run as the server


class LocalObjectStoreError(RuntimeError):
    """The server could not be started (moto missing, port taken, no answer in time); the message
    says why and ends with its log's tail."""


def credential_environment(region: str = DEFAULT_REGION) -> dict[str, str]:
    """What a process needs in its environment to reach a local object store through the AWS
    credential chain: keys, region, and nothing that makes botocore look elsewhere (instance
    metadata, the user's ``~/.aws/config`` and ``~/.aws/credentials``)."""
    return {
        "AWS_ACCESS_KEY_ID": ACCESS_KEY_ID,
        "AWS_SECRET_ACCESS_KEY": SECRET_ACCESS_KEY,
        "AWS_DEFAULT_REGION": region,
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    }


class LocalObjectStore:
    """``start()`` → the endpoint URL; ``stop()`` ends the server (and its contents). The port
    chosen at the first start is kept, so a restarted server has the same ``endpoint_url``."""

    def __init__(
        self,
        log_path: str | os.PathLike[str],
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        region: str = DEFAULT_REGION,
        start_timeout_s: float = 30.0,
    ) -> None:
        self.log_path = Path(log_path).absolute()
        self.host = host
        self.port = port
        self.region = region
        self.start_timeout_s = start_timeout_s
        self.proc: subprocess.Popen[bytes] | None = None
        self.paused = False
        self._guard_fd: int | None = None  # the pipe's write end; the child exits when it closes
        self._exit_hook = False

    @property
    def endpoint_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host  # an IPv6 address in a URL
        return f"http://{host}:{self.port}"

    @property
    def ready_path(self) -> Path:
        return self.log_path.with_name(self.log_path.name + ".ready")

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> str:
        """Start the server (on ``port``, or a free port the first time when it is 0) and wait
        until it listens; returns ``endpoint_url``. A no-op while it runs."""
        if self.running:
            return self.endpoint_url
        self.stop()  # one that died on its own: reap it, close its pipe
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.ready_path.unlink(missing_ok=True)
        read_end, self._guard_fd = os.pipe()
        args = [sys.executable, "-m", CHILD_MODULE, "--host", self.host, "--port", str(self.port)]
        args += ["--ready-file", str(self.ready_path), "--guard-fd", str(read_end)]
        try:
            with open(self.log_path, "ab") as log:
                self.proc = subprocess.Popen(
                    args, stdout=log, stderr=subprocess.STDOUT, pass_fds=(read_end,), start_new_session=True
                )
        finally:
            os.close(read_end)
        if not self._exit_hook:
            atexit.register(self.stop)
            self._exit_hook = True
        self.paused = False
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline and self.proc.poll() is None:
            if self.ready_path.exists():
                self.port = int(json.loads(self.ready_path.read_text())["port"])
                return self.endpoint_url
            time.sleep(READY_POLL_S)  # deadline poll for the ready file
        self.stop()
        tail = self.log_path.read_text(errors="replace")[-2000:] if self.log_path.exists() else ""
        raise LocalObjectStoreError(f"the object store did not start on {self.host}:{self.port}:\n{tail}")

    def stop(self, *, timeout_s: float = 10.0) -> None:
        """End the server (everything it held is lost); ``start()`` brings up an empty one on
        the same port."""
        proc, self.proc = self.proc, None
        if self._guard_fd is not None:
            os.close(self._guard_fd)  # the child's cue to shut down
            self._guard_fd = None
        if proc is None:
            return
        if proc.poll() is None:
            if self.paused:
                proc.send_signal(signal.SIGCONT)
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.paused = False

    def pause(self) -> None:
        """Freeze the server (SIGSTOP): requests hang until ``resume()``; nothing is lost."""
        if not self.running:
            raise LocalObjectStoreError("the object store is not running")
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        """Let a paused server answer again (SIGCONT)."""
        if self.running and self.paused:
            assert self.proc is not None
            self.proc.send_signal(signal.SIGCONT)
        self.paused = False

    def environment(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """The whole environment (``Popen(env=...)``) of a process that should reach this store
        through the AWS credential chain, a broker: ``base`` (default ``os.environ``) without its
        ``AWS_*`` variables, plus ``credential_environment``. The endpoint is not in it: that is
        configuration (``[store] tier_endpoint_url``)."""
        base = os.environ if base is None else base
        kept = {k: v for k, v in base.items() if not k.startswith("AWS_")}
        return {**kept, **credential_environment(self.region)}

    def client(self, *, timeout_s: float = 5.0, attempts: int = 3) -> Any:
        """A boto3 S3 client of this store, with the dummy credentials (``timeout_s`` for connect
        and for each read; ``attempts`` in all, retries included)."""
        import boto3
        from botocore.config import Config

        session = boto3.session.Session(
            aws_access_key_id=ACCESS_KEY_ID, aws_secret_access_key=SECRET_ACCESS_KEY, region_name=self.region
        )
        config = Config(connect_timeout=timeout_s, read_timeout=timeout_s, retries={"total_max_attempts": attempts})
        return session.client("s3", endpoint_url=self.endpoint_url, config=config)

    def create_bucket(self, name: str) -> None:
        """Create bucket ``name`` (a no-op when this store already has it); LocalObjectStoreError
        when the store does not take it."""
        from botocore.exceptions import BotoCoreError, ClientError

        client = self.client()
        try:
            client.create_bucket(Bucket=name)
        except client.exceptions.BucketAlreadyOwnedByYou:
            pass
        except (BotoCoreError, ClientError) as e:
            raise LocalObjectStoreError(f"bucket {name!r} was not created at {self.endpoint_url}: {e}") from e
        finally:
            client.close()

    def delete_bucket(self, name: str) -> None:
        """Delete bucket ``name`` and every object in it (a no-op when there is no such bucket)."""
        client = self.client()
        try:
            for page in client.get_paginator("list_objects_v2").paginate(Bucket=name):
                keys = [{"Key": o["Key"]} for o in page.get("Contents", ())]
                if keys:  # a page holds at most 1,000 keys, as many as one delete_objects takes
                    client.delete_objects(Bucket=name, Delete={"Objects": keys, "Quiet": True})
            client.delete_bucket(Bucket=name)
        except client.exceptions.NoSuchBucket:
            pass
        finally:
            client.close()

    def __enter__(self) -> LocalObjectStore:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve(argv: list[str] | None = None) -> int:
    """The child: moto's S3 server on ``--host``/``--port`` until SIGTERM or until the pipe
    ``--guard-fd`` reads end-of-file (its owner closed it, or exited)."""
    parser = argparse.ArgumentParser(prog=f"python -m {CHILD_MODULE}")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--ready-file", required=True)
    parser.add_argument("--guard-fd", type=int, required=True)
    args = parser.parse_args(argv)
    # Listen first (a taken port fails at once, before moto's import of a second or so), then
    # hand the socket to werkzeug.
    listener = socket.socket(socket.AF_INET6 if ":" in args.host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restart on the same port
        listener.bind((args.host, args.port))
        listener.listen(LISTEN_BACKLOG)
    except OSError as e:
        listener.close()
        print(f"cannot listen on {args.host}:{args.port}: {e}", file=sys.stderr)
        return 3
    try:
        from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
        from werkzeug.serving import make_server
    except ImportError as e:
        print(f"moto's server is not installed ({e}): install the dev extra (moto[server])", file=sys.stderr)
        return 2
    app = DomainDispatcherApplication(create_backend_app)
    with listener:  # werkzeug listens on a duplicate of it
        server = make_server(
            args.host, args.port, app, threaded=True, request_handler=MotoRequestHandler, fd=listener.fileno()
        )
    os.environ["MOTO_PORT"] = str(server.port)  # moto builds some URLs from it, as moto_server sets it
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
    # serve_forever looks for shutdown() every poll_interval: short, so that a stop is quick.
    worker = threading.Thread(target=server.serve_forever, args=(SHUTDOWN_POLL_S,), name="moto-s3", daemon=True)
    worker.start()
    tmp = args.ready_file + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"port": server.port, "pid": os.getpid()}, f)
    os.replace(tmp, args.ready_file)
    print(f"moto S3 server on http://{args.host}:{server.port}", flush=True)
    try:
        while os.read(args.guard_fd, 1):
            pass
    finally:
        server.shutdown()
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(serve())
