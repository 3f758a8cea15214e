"""Peers: brokers a user would pick instead of Orbit, started on 127.0.0.1 by the harness with
durability settings comparable to Orbit's default (ASYNC_FLUSH: acknowledged once in the page
cache, on disk within about a second). Each peer module holds its server (a child process of a
Debian-packaged binary found on PATH) and its publisher/subscriber adapters.

No Kafka-compatible broker is included: none could be installed from the package registries
this project uses (PyPI, Debian, npm) — see docs/loadtest.md."""

from __future__ import annotations

import importlib
import os
import shutil
import socket
import subprocess
import time
from typing import Any


class PeerUnavailable(RuntimeError):
    """A peer's server binary or Python client is missing; the message says how to install it."""


def import_client(module: str, *, requirement: str) -> Any:
    """A peer's Python client module, or PeerUnavailable saying how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise PeerUnavailable(
            f"the Python client {module!r} is missing: .venv/bin/pip install '{requirement}' "
            "(or install the loadtest extra: scripts/venv.sh loadtest)"
        ) from None


def find_binary(name: str, *, debian_package: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise PeerUnavailable(f"{name} is not on PATH; install it with: sudo apt-get install -y {debian_package}")
    return path


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago (for servers that cannot bind port 0 and report it)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def start_server(argv: list[str], *, port: int, log_path: str, timeout_s: float = 30.0) -> subprocess.Popen[bytes]:
    """Start ``argv`` and wait until 127.0.0.1:``port`` accepts connections."""
    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return proc
        except OSError:
            time.sleep(0.05)
    stop_server(proc)
    with open(log_path, errors="replace") as f:
        tail = f.read()[-2000:]
    raise PeerUnavailable(f"{argv[0]} did not start; the end of {log_path}:\n{tail}")


def stop_server(proc: subprocess.Popen[bytes], timeout_s: float = 15.0) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class PeerServer:
    """A peer's server process: its Debian binary found on PATH, its state under ``root``, on a
    port picked here (these servers cannot bind port 0 and report it). Subclasses give the
    command line, the client check and the spec generators receive."""

    kind = ""
    binary = ""
    debian_package = ""

    def __init__(self, root: str) -> None:
        self.root = root
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0

    def argv(self, binary: str, data_dir: str) -> list[str]:
        raise NotImplementedError

    def spec(self) -> dict[str, Any]:
        raise NotImplementedError

    def check_client(self) -> None:
        """Raise PeerUnavailable when the Python client is missing (before starting anything)."""

    def start(self) -> dict[str, Any]:
        binary = find_binary(self.binary, debian_package=self.debian_package)
        self.check_client()
        self.port = free_port()
        data = os.path.join(self.root, self.kind)
        os.makedirs(data, exist_ok=True)
        self.proc = start_server(
            self.argv(binary, data), port=self.port, log_path=os.path.join(self.root, "run", f"{self.binary}.log")
        )
        return self.spec()

    def prepare(self, spec: dict[str, Any], *, topics: list[str], queues: int) -> None:
        """Create what the generators need before they start (nothing by default)."""

    def stop(self) -> None:
        if self.proc is not None:
            stop_server(self.proc)
