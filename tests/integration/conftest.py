"""Real name server and broker processes on 127.0.0.1, port 0.

Each process is ``python -m data_plane.cli <namesrv|broker> ... --ready-file F``; it binds
port 0 and writes ``{"address": "127.0.0.1:<port>", ...}`` to F once it serves, which is how
the test learns the port. Processes are stopped (SIGTERM, then SIGKILL) after the test.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from data_plane import local_cluster
from data_plane.local_cluster import Child

# Test brokers' store geometry: 16 MiB CommitLog files, nothing reserved ahead, small indexes —
# the production defaults would reserve a 1 GiB file (and 128 MiB of page cache) per broker.
SMALL_STORE = [
    "--store-set",
    "commit_log_file_size_bytes=16777216",
    "--store-set",
    "reserve_ahead_bytes=0",
    "--store-set",
    "index_hash_slots=65536",
    "--store-set",
    "index_max_entries=262144",
]


@dataclass
class ServerProcess:
    kind: str
    address: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def port(self) -> int:
        return int(self.address.rpartition(":")[2])

    def stop(self, timeout_s: float = 15.0) -> int:
        """SIGTERM and wait: a clean shutdown."""
        Child(self.kind, self.proc, self.info, str(self.log_path)).stop(timeout_s)
        return self.proc.returncode

    def kill(self) -> None:
        """kill -9: no shutdown at all."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def spawn(kind: str, args: list[str], workdir: Path) -> ServerProcess:
    """Start ``orbit <kind> <args>`` and wait until it serves (``local_cluster.spawn``; each
    process of a test gets its own ready and log file under ``workdir``)."""
    workdir.mkdir(parents=True, exist_ok=True)
    n = len(list(workdir.glob(f"{kind}-*.log")))
    try:
        child = local_cluster.spawn(kind, f"{kind}-{n}", args, str(workdir), new_session=False)
    except local_cluster.ClusterError as e:
        raise RuntimeError(str(e)) from None
    return ServerProcess(kind, child.address, child.proc, Path(child.log_path), child.info)


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[list[ServerProcess]]:
    started: list[ServerProcess] = []
    yield started
    for p in reversed(started):
        p.stop()


@pytest.fixture
def start_namesrv(tmp_path: Path, processes: list[ServerProcess]) -> Callable[..., ServerProcess]:
    def start(*extra: str) -> ServerProcess:
        p = spawn("namesrv", ["--listen", "127.0.0.1:0", *extra], tmp_path / "run")
        processes.append(p)
        return p

    return start


@pytest.fixture
def namesrv(start_namesrv: Callable[..., ServerProcess]) -> ServerProcess:
    return start_namesrv()


@pytest.fixture
def start_broker(tmp_path: Path, processes: list[ServerProcess]) -> Callable[..., ServerProcess]:
    """``start_broker(namesrv_addr, name="broker-a", store_dir=None, *extra_flags)``: a broker
    process with its store under tmp_path (the same name → the same store dir on restart).
    ``namesrv_addr=None``: a broker without name servers (no --namesrv flag)."""

    def start(
        namesrv_addr: str | None, *extra: str, name: str = "broker-a", store_dir: Path | None = None
    ) -> ServerProcess:
        store = store_dir or tmp_path / "stores" / name
        namesrv = ["--namesrv", namesrv_addr] if namesrv_addr is not None else []
        args = [
            "--listen",
            "127.0.0.1:0",
            *namesrv,
            "--broker-name",
            name,
            "--store-dir",
            str(store),
            *SMALL_STORE,
            *extra,  # later --store-set values win over SMALL_STORE's
        ]
        p = spawn("broker", args, tmp_path / "run")
        processes.append(p)
        return p

    return start


@pytest.fixture
def cluster(namesrv: ServerProcess, start_broker: Callable[..., ServerProcess]) -> tuple[ServerProcess, ServerProcess]:
    """One name server and one broker (ASYNC_FLUSH), registered."""
    return namesrv, start_broker(namesrv.address)


@pytest.fixture
def namesrv_addr(namesrv: ServerProcess, start_broker: Callable[..., ServerProcess]) -> str:
    """A name server and one registered broker (small store files); the name server's address."""
    start_broker(namesrv.address)
    return namesrv.address
