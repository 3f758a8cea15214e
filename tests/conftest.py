"""Shared fixtures. Randomized tests print their seed; set ORBIT_TEST_SEED to replay one."""

from __future__ import annotations

import importlib
import os
import random
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any, NoReturn

import pytest

from data_plane.store import MessageStore, StoreConfig, fastpath


@pytest.fixture
def seed(request: pytest.FixtureRequest) -> int:
    """A seed for a randomized test: printed, and replayable with ORBIT_TEST_SEED."""
    value = int(os.environ.get("ORBIT_TEST_SEED", random.SystemRandom().randrange(2**32)))
    print(f"\n[seed] {request.node.nodeid}: ORBIT_TEST_SEED={value}")
    return value


def c_compiler() -> str | None:
    """The C compiler that building Orbit's extensions would use (sysconfig's CC), if present."""
    cc = (sysconfig.get_config_var("CC") or "cc").split()
    return shutil.which(cc[0]) if cc else None


PURE_PYTHON = bool(os.environ.get("ORBIT_PURE_PYTHON"))
# The compiled twins are not expected here: switched off, or nothing could have built them.
NO_COMPILED_TWINS = PURE_PYTHON or c_compiler() is None


def compiled_missing(what: str) -> NoReturn:
    """A test of a compiled twin found it absent: skip in the pure-Python run (ORBIT_PURE_PYTHON)
    and where there is no C compiler; fail where there is one, since then the build failed and
    the suite must not pass around it."""
    if PURE_PYTHON:
        pytest.skip("ORBIT_PURE_PYTHON is set")
    if c_compiler() is None:
        pytest.skip(f"{what} is not built (no C compiler here)")
    pytest.fail(f"{what} is not built although a C compiler is present: the extension's build failed (setup.py)")


@pytest.fixture(params=["compiled", "pure-python"])
def write_path(request: pytest.FixtureRequest) -> Iterator[str]:
    """Run a test against both twins of the write path's fast loops."""
    was = fastpath.COMPILED
    if request.param == "compiled" and PURE_PYTHON:
        # the store's classes are the pure-Python twins (positions.py): no compiled appender
        pytest.skip("ORBIT_PURE_PYTHON is set")
    if request.param == "compiled" and not fastpath.use_compiled(True):
        compiled_missing("the compiled fast path (data_plane.store._speedups)")
    if request.param == "pure-python":
        fastpath.use_compiled(False)
    try:
        yield request.param
    finally:
        fastpath.use_compiled(was)


def _compiled_module(name: str) -> ModuleType:
    if PURE_PYTHON:
        pytest.skip("ORBIT_PURE_PYTHON is set")
    try:
        return importlib.import_module(name)
    except ImportError:
        compiled_missing(name)


@pytest.fixture
def speedups() -> ModuleType:
    """The compiled store module (data_plane/store/_speedups.c); see ``compiled_missing`` for
    where it is not built."""
    return _compiled_module("data_plane.store._speedups")


@pytest.fixture
def records() -> ModuleType:
    """The compiled SDK record codecs (data_plane/store/_records.c)."""
    return _compiled_module("data_plane.store._records")


@pytest.fixture
def batch() -> ModuleType:
    """The compiled batch decoding of the broker (data_plane/broker/_batch.c)."""
    return _compiled_module("data_plane.broker._batch")


@pytest.fixture
def v2_codec() -> ModuleType:
    """The compiled SendMessageRequest reading of the gRPC endpoint (data_plane/proxy/_v2_codec.c)."""
    return _compiled_module("data_plane.proxy._v2_codec")


def counter_points(reader: Any, name: str, key: str, *, broker_name: str = "broker-a") -> dict[str, int]:
    """The data points of the observable counter ``name`` an ``InMemoryMetricReader`` collects
    now, by their ``key`` attribute (each asserted to carry ``broker_name``)."""
    data = reader.get_metrics_data()
    out: dict[str, int] = {}
    for rm in data.resource_metrics if data is not None else ():
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                assert metric.name == name
                for point in metric.data.data_points:
                    attrs = dict(point.attributes or {})
                    assert attrs["orbit.broker.name"] == broker_name
                    out[str(attrs[key])] = int(point.value)
    return out


class ManualClock:
    """The store's injected clock, moved by the test."""

    def __init__(self, start_ms: int = 1_700_000_000_000) -> None:
        self.now_ms = start_ms

    def __call__(self) -> int:
        return self.now_ms

    def advance(self, ms: int) -> None:
        self.now_ms += ms


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


def run_store_script(template: str, **fields: object) -> list[str]:
    """Run ``template`` (formatted with ``fields`` and ``root``, the repository) in a Python
    process of its own — one that may die without a shutdown — and return its stdout's lines
    (a non-zero exit fails the test with its stderr)."""
    root = str(Path(__file__).resolve().parents[1])
    script = textwrap.dedent(template.format(root=root, **fields))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return [line for line in done.stdout.split("\n") if line]


def small_config(path: str, **changes: object) -> StoreConfig:
    """Geometry small enough that tests cross file boundaries with a few messages."""
    base: dict[str, object] = {
        "store_path": path,
        "commit_log_file_size_bytes": 64 * 1024,
        "max_message_size_bytes": 16 * 1024,
        "consume_queue_units_per_file": 64,
        "index_hash_slots": 64,
        "index_max_entries": 256,
        "flush_interval_commit_log_ms": 50,
        "flush_interval_consume_queue_ms": 50,
        "flush_interval_index_ms": 50,
        "preallocate_next_file": False,
    }
    base.update(changes)
    return StoreConfig(**base)  # type: ignore[arg-type]


@pytest.fixture
def make_store(tmp_path: Path, clock: ManualClock) -> Iterator[Callable[..., MessageStore]]:
    """``make_store(**config changes)`` → a started store under tmp_path (shut down after)."""
    made: list[MessageStore] = []

    def make(path: str | None = None, disk: Callable[[str], float] | None = None, **changes: object) -> MessageStore:
        config = small_config(path or str(tmp_path / "store"), **changes)
        store = MessageStore(config, clock_ms=clock, disk_usage_ratio=disk)
        store.start()
        made.append(store)
        return store

    yield make
    for store in made:
        store.shutdown()


def until(check: Callable[[], bool], timeout_s: float = 5.0) -> bool:
    """Poll ``check`` every 2 ms until it holds (True) or ``timeout_s`` passes (its last answer)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.002)
    return check()
