"""Shared pieces of the Spark tests: one local SparkSession for the whole run (with
``format("orbit")`` registered and everything the JVM and its Python workers print going to a
log file the tests can search), and a name server + broker kept for a whole test module.

    from tests.integration.spark_support import orbit_cluster_fixture, spark_fixture  # noqa: F401
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pytest
from pyspark.sql import SparkSession

from sdk.admin import AdminClient
from tests.integration.conftest import SMALL_STORE, ServerProcess, spawn

REPO = Path(__file__).resolve().parents[2]
T = TypeVar("T")


@dataclass
class SparkHandle:
    session: SparkSession
    log_path: Path

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")


_HANDLE: SparkHandle | None = None


@pytest.fixture(scope="session", name="spark")
def spark_fixture() -> Iterator[SparkHandle]:
    """One session for the whole run. Each test module imports this fixture, which makes a
    fixture definition per module: the first one starts Spark, the others reuse it."""
    global _HANDLE
    if _HANDLE is not None:
        yield _HANDLE
        return
    from spark_integration import register

    # Not under pytest's basetemp: a concurrent pytest run may prune old basetemp directories.
    log_dir = Path(tempfile.mkdtemp(prefix="orbit-spark-"))
    log_path = log_dir / "spark.log"
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    # The JVM (and the Python workers it starts) inherit fd 2 at launch: point it at the log file
    # for the launch only, so the whole session's JVM output lands there and not in pytest's.
    saved = os.dup(2)
    with open(log_path, "ab") as log:
        os.dup2(log.fileno(), 2)
        try:
            session = (
                SparkSession.builder.master("local[2]")
                .appName("orbit-spark-tests")
                .config("spark.ui.enabled", "false")
                .config("spark.driver.memory", "512m")
                .config("spark.sql.shuffle.partitions", "2")
                .config("spark.sql.session.timeZone", "UTC")
                .config("spark.python.worker.reuse", "true")
                .getOrCreate()
            )
        finally:
            os.dup2(saved, 2)
            os.close(saved)
    session.sparkContext.setLogLevel("WARN")
    register(session)
    _HANDLE = SparkHandle(session, log_path)
    try:
        yield _HANDLE
    finally:
        _HANDLE = None
        session.stop()
        shutil.rmtree(log_dir, ignore_errors=True)


async def off_loop(spark: SparkHandle, action: Callable[[], T]) -> T:
    """Run a Spark action in a worker thread (for async tests whose event loop serves the control
    plane's tokens). The JVM's active session is per thread: set it there first."""
    session = spark.session

    def run() -> T:
        session._jvm.SparkSession.setActiveSession(session._jsparkSession)  # type: ignore[union-attr]
        return action()

    return await asyncio.to_thread(run)


@dataclass
class OrbitCluster:
    namesrv: ServerProcess
    broker: ServerProcess

    @property
    def addr(self) -> str:
        return self.namesrv.address

    def create_topic(self, topic: str, queues: int = 4) -> None:
        async def create() -> None:
            async with AdminClient([self.addr]) as admin:
                await admin.create_topic(topic, queue_nums=queues)
                for _ in range(100):  # the broker registers the topic with the name server
                    try:
                        await admin.route(topic)
                        return
                    except Exception:
                        await asyncio.sleep(0.1)
                raise AssertionError(f"topic {topic} has no route")

        asyncio.run(create())


@contextlib.contextmanager
def start_orbit_cluster(
    tmp: Path, *, broker_name: str = "broker-a", store_flags: Sequence[str] = SMALL_STORE
) -> Iterator[OrbitCluster]:
    """A name server and a broker (store under ``tmp/store``), stopped on exit."""
    ns = spawn("namesrv", ["--listen", "127.0.0.1:0"], tmp / "run")
    try:
        broker = spawn(
            "broker",
            ["--listen", "127.0.0.1:0", "--namesrv", ns.address, "--broker-name", broker_name,
             "--store-dir", str(tmp / "store"), *store_flags],
            tmp / "run",
        )  # fmt: skip
        try:
            yield OrbitCluster(ns, broker)
        finally:
            broker.stop()
    finally:
        ns.stop()


@pytest.fixture(scope="module", name="orbit_cluster")
def orbit_cluster_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OrbitCluster]:
    """A name server and a broker (small store) for a whole test module."""
    with start_orbit_cluster(tmp_path_factory.mktemp("orbit")) as cluster:
        yield cluster
