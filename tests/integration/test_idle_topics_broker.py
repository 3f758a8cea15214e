"""Idle costs nothing, through a real broker process: a topic idle past ``idle_queue_close_s`` has
no file of its ConsumeQueues mapped or open in the broker, and its next send and pull work
(store/idle_queues.py)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from data_plane.remoting.codes import ResponseCode
from tests.integration.conftest import ServerProcess
from tests.integration.helpers import until
from tests.integration.test_broker import Wire, records

IDLE = ["--set", "idle_queue_close_s=1", *("--store-set", "flush_interval_consume_queue_ms=100")]


def _held(pid: int, directory: Path) -> list[str]:
    """The broker's mappings and descriptors of files under ``directory``."""
    prefix = str(directory) + os.sep
    with open(f"/proc/{pid}/maps") as f:
        out = [line.split()[-1] for line in f if prefix in line]
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue  # (closed meanwhile)
        if target.startswith(prefix):
            out.append(target)
    return out


@pytest.mark.asyncio
async def test_an_idle_topic_holds_nothing_in_the_broker_and_comes_back_on_its_next_message(
    start_broker: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    broker = start_broker(None, *IDLE)
    wire = Wire(broker.address)
    try:
        await _idle_topic(wire, broker.proc.pid, tmp_path / "stores" / "broker-a" / "store" / "consumequeue" / "Sleepy")
    finally:
        await wire.close()


async def _idle_topic(wire: Wire, pid: int, queues: Path) -> None:
    await wire.create_topic("Sleepy", 2)
    for q in range(2):
        for i in range(3):
            await wire.send_ok("Sleepy", f"before {q} {i}".encode(), queue_id=q)
    assert _held(pid, queues), "a topic just written is mapped"

    await until(lambda: _held(pid, queues) == [], "the idle topic's ConsumeQueues let go of", timeout_s=20)
    info = await wire.runtime()
    assert int(info["idleClosedQueues"]) >= 2
    assert int(info["openFds"]) > 0
    mapped_idle = int(info["mappedQueueFiles"])
    # A consumer at the end of the idle queue is answered from memory: the queue stays closed.
    r = await wire.pull("Sleepy", 0, 3)
    assert r.code == ResponseCode.PULL_NOT_FOUND, r
    assert _held(pid, queues) == []

    ext = await wire.send_ok("Sleepy", b"after the idle time", queue_id=0)
    assert ext["queueOffset"] == "3"
    r = await wire.pull("Sleepy", 0, 0)
    assert r.code == ResponseCode.SUCCESS, r
    assert [m.body for m in records(r)] == [*(f"before 0 {i}".encode() for i in range(3)), b"after the idle time"]
    assert [m.body for m in await wire.pull_all("Sleepy", 1)] == [f"before 1 {i}".encode() for i in range(3)]
    assert _held(pid, queues), "mapped again"
    assert int((await wire.runtime())["mappedQueueFiles"]) >= mapped_idle + 2, "both queues' files counted again"
