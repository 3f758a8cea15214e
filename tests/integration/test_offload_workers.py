"""The offload's worker processes (data_plane/store/tier/offload_workers.py): uploads and index
builds run outside the broker's process, in the background (SCHED_IDLE, or nice 10), and an
upload paced by ``tier_upload_bytes_per_s`` reaches the object store (moto's server over real
HTTP) intact and no faster than asked."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from data_plane.store.tier.object_store import ObjectStore
from data_plane.store.tier.offload_workers import BACKGROUND_NICE, OffloadWorkers
from tests.object_store_fixture import object_store_fixture, tier_bucket_fixture  # noqa: F401

MIB = 1024 * 1024


@pytest.fixture(params=[True, False], ids=["idle", "nice"])
def workers(request: pytest.FixtureRequest) -> Iterator[OffloadWorkers]:
    w = OffloadWorkers(idle=request.param)
    try:
        yield w
    finally:
        w.shutdown()


def test_workers_run_in_the_background_and_the_broker_keeps_its_priority(workers: OffloadWorkers) -> None:
    mine = os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, 0)
    policy, nice = workers.scheduling()
    if workers.idle:
        assert policy == os.SCHED_IDLE
    else:
        assert (policy, nice) == (os.SCHED_OTHER, min(19, mine[1] + BACKGROUND_NICE))
    assert (os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, 0)) == mine


def test_a_paced_upload_from_a_worker_arrives_whole_and_no_faster_than_asked(
    workers: OffloadWorkers, tier_bucket: tuple[str, str], tmp_path: Path
) -> None:
    endpoint_url, bucket = tier_bucket
    store = ObjectStore(bucket, endpoint_url=endpoint_url)
    path = tmp_path / "00000000000000000000"
    data = os.urandom(11 * MIB)  # parts of 5 MiB, 5 MiB and 1 MiB
    path.write_bytes(data + os.urandom(MIB))  # (bytes past the length stay behind)
    rate = 4 * MIB
    began = time.monotonic()
    up = workers.result(workers.upload(store.endpoint, "g/commitlog/0", str(path), len(data), 5 * MIB, rate))
    took = time.monotonic() - began
    assert up.size == len(data)
    assert store.get_range("g/commitlog/0", 0, len(data)) == data
    assert took >= (len(data) - 64 * 1024) / rate * 0.98, took


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_workers_die_with_a_broker_killed_with_9() -> None:
    # An orphaned upload must not finish after the broker that would record it is gone.
    script = (
        "import sys, time\n"
        "from data_plane.store.tier.offload_workers import OffloadWorkers\n"
        "w = OffloadWorkers(idle=True)\n"
        "w.scheduling()\n"
        "print(*w.pids(), flush=True)\n"
        "time.sleep(600)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=os.getcwd())
    try:
        assert proc.stdout is not None
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert pids
        assert all(_alive(p) for p in pids)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        deadline = time.monotonic() + 10
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not any(_alive(p) for p in pids), [p for p in pids if _alive(p)]
    finally:
        proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
