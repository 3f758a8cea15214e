"""Security: a filling disk must not delete acknowledged messages inside their retention.

Retention used to free space at 75 % disk use by deleting the oldest CommitLog files whatever
their age: with small files on a filling disk, most acknowledged, never-consumed messages of
topics well inside their retention were gone. Now, under disk pressure only files past
retention go; at the write watermark (90 %) sends are refused with a clear status; only past
the emergency watermark (95 %) do files inside retention go, oldest first — and each tenant's
loss is counted (runtime info, GET_BROKER_RUNTIME_INFO) and logged.

A real broker process with 256 KiB CommitLog files; its disk-usage reading comes from the file
the test writes (``disk_usage_override_file``, the store's test hook), read every 100 ms round.
"""

from __future__ import annotations

import asyncio
import functools
import random
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from data_plane.remoting import bodies
from data_plane.remoting.client import RemotingClient
from data_plane.remoting.codes import RequestCode, ResponseCode
from data_plane.remoting.command import RemotingCommand
from data_plane.store.message import decode_message_id
from sdk import Message, MessageQueue, protocol
from sdk.message import new_unique_ids
from tests.integration import helpers
from tests.integration.conftest import ServerProcess

pytestmark = [pytest.mark.asyncio]

FILE_BYTES = 256 * 1024
ROUND_MS = 100  # clean_resource_interval_ms
TOPICS = ("acme%orders", "globex%events")
TENANTS = {"acme%orders": "acme", "globex%events": "globex"}
BROKER = "broker-a"
GROUP = "acme%reader"

Acked = dict[tuple[str, int], tuple[int, bytes]]  # (topic, queue offset) -> (CommitLog offset, body)


async def call(client: RemotingClient, broker: ServerProcess, cmd: RemotingCommand) -> RemotingCommand:
    return await client.invoke(broker.address, cmd, timeout_ms=10_000)


async def runtime(client: RemotingClient, broker: ServerProcess) -> dict[str, str]:
    r = await call(client, broker, RemotingCommand(RequestCode.GET_BROKER_RUNTIME_INFO))
    assert r.code == ResponseCode.SUCCESS, r.remark
    table: dict[str, str] = bodies.loads(r.body_bytes())["table"]
    return table


def batch(topic: str, bodies_: list[bytes]) -> RemotingCommand:
    return protocol.send_batch_request(
        group="producers", msgs=[Message(topic, b) for b in bodies_], queue_id=0,
        unique_ids=new_unique_ids(len(bodies_)), born_timestamp_ms=int(time.time() * 1000),
    )  # fmt: skip


async def send_until(
    client: RemotingClient, broker: ServerProcess, rng: random.Random, acked: Acked, log_bytes: int
) -> None:
    """Send batches to both topics (bodies of seeded sizes) until the CommitLog holds
    ``log_bytes``; every acknowledged message goes into ``acked``."""
    while int((await runtime(client, broker))["commitLogMaxOffset"]) < log_bytes:
        topic = rng.choice(TOPICS)
        sent = [rng.randbytes(rng.randint(200, 1500)) for _ in range(rng.randint(8, 32))]
        r = await call(client, broker, batch(topic, sent))
        assert r.code == ResponseCode.SUCCESS, (r.code, r.remark)
        ext = r.ext_fields or {}
        first = int(ext["queueOffset"])
        for i, (msg_id, body) in enumerate(zip(ext["msgId"].split(","), sent, strict=True)):
            acked[(topic, first + i)] = (decode_message_id(msg_id)[2], body)


async def read_back(client: RemotingClient, broker: ServerProcess) -> dict[tuple[str, int], bytes]:
    """Every message still readable in queue 0 of both topics (reads commit no offset)."""
    out: dict[tuple[str, int], bytes] = {}
    for topic in TOPICS:
        offset = 0
        while True:
            cmd = protocol.pull_request(
                group=GROUP, mq=MessageQueue(topic, BROKER, 0), offset=offset, max_nums=32, subscription="*",
                sub_version=0, suspend_timeout_ms=0, suspend=False,
            )  # fmt: skip
            r = await call(client, broker, cmd)
            if r.code == ResponseCode.PULL_OFFSET_MOVED:  # below the queue's min offset: go there
                offset = protocol.parse_pull_response(r, BROKER).next_begin_offset
                continue
            assert r.code in (ResponseCode.SUCCESS, ResponseCode.PULL_NOT_FOUND), (r.code, r.remark)
            pulled = protocol.parse_pull_response(r, BROKER)
            if not pulled.messages:
                break
            for m in pulled.messages:
                out[(topic, m.queue_offset)] = m.body
            offset = pulled.next_begin_offset
    return out


async def rounds(n: int = 5) -> None:
    """Let the broker's retention run ``n`` rounds."""
    await asyncio.sleep(n * ROUND_MS / 1000)


async def test_disk_pressure_refuses_writes_and_only_the_emergency_watermark_deletes_in_retention(
    start_broker: Callable[..., ServerProcess], tmp_path: Path, seed: int
) -> None:
    rng = random.Random(seed)
    disk = tmp_path / "disk-usage"
    disk.write_text("0.10")
    broker = start_broker(
        None,
        "--store-set", f"commit_log_file_size_bytes={FILE_BYTES}",
        "--store-set", "max_message_size_bytes=65536",
        "--store-set", f"disk_usage_override_file={disk}",
        "--store-set", f"clean_resource_interval_ms={ROUND_MS}",
        name=BROKER,
    )  # fmt: skip
    client = RemotingClient()
    try:
        for topic in TOPICS:
            r = await call(client, broker, protocol.create_topic_request(topic, queue_nums=1))
            assert r.code == ResponseCode.SUCCESS, r.remark
        acked: Acked = {}
        await send_until(client, broker, rng, acked, 6 * FILE_BYTES + FILE_BYTES // 2)  # 7 files
        want = {k: body for k, (_, body) in acked.items()}
        assert await read_back(client, broker) == want

        # Pressure, then the write watermark: every acknowledged message stays.
        for usage in (rng.uniform(0.75, 0.85), rng.uniform(0.85, 0.90), rng.uniform(0.90, 0.945)):
            disk.write_text(f"{usage:.4f}")
            full = usage >= 0.90
            await helpers.until(functools.partial(_disk_full, client, broker, full), f"diskFull={full}", timeout_s=10)
            await rounds()
            info = await runtime(client, broker)
            assert info["commitLogMinOffset"] == "0", f"retention deleted files at {usage:.1%} disk use: {info}"
            assert info["forcedDeletionFiles"] == "0"
            assert await read_back(client, broker) == want, f"messages inside retention lost at {usage:.1%}"
        refused = await call(client, broker, batch(TOPICS[0], [b"no room"]))
        assert refused.code == ResponseCode.SERVICE_NOT_AVAILABLE, (refused.code, refused.remark)
        remark = refused.remark or ""
        assert "disk is full" in remark, remark
        assert "disk_space_warning_level_ratio" in remark, remark

        # Past the emergency watermark: the oldest files go (the reading stays high, so all but
        # the file being written), and each tenant's loss is counted and logged.
        disk.write_text("0.96")
        await helpers.until(lambda: _forced(client, broker), "a forced deletion", timeout_s=10)
        await rounds()
        info = await runtime(client, broker)
        log_min = int(info["commitLogMinOffset"])
        assert log_min == 6 * FILE_BYTES, info
        assert info["forcedDeletionFiles"] == "6"
        lost = dict.fromkeys(TENANTS.values(), 0)
        for (topic, _), (offset, _) in acked.items():
            lost[TENANTS[topic]] += offset < log_min
        assert all(lost.values()), lost
        assert {t: int(info.get(f"forcedDeletionMessages.{t}", "0")) for t in lost} == lost
        assert int(info["forcedDeletionMessages"]) == sum(lost.values())
        text = broker.log_text()
        for tenant, n in lost.items():  # a line per file and tenant; the last one has the total
            assert f"tenant {tenant} lost" in text, text[-2000:]
            assert f"inside their retention ({n} so far)" in text, text[-2000:]
        survivors = {k: body for k, (offset, body) in acked.items() if offset >= log_min}
        assert await read_back(client, broker) == survivors
        still = await call(client, broker, batch(TOPICS[1], [b"still no room"]))
        assert still.code == ResponseCode.SERVICE_NOT_AVAILABLE, (still.code, still.remark)
    finally:
        await client.close()


async def _disk_full(client: RemotingClient, broker: ServerProcess, full: bool) -> bool:
    return (await runtime(client, broker))["diskFull"] == str(full)


async def _forced(client: RemotingClient, broker: ServerProcess) -> bool:
    return int((await runtime(client, broker)).get("forcedDeletionFiles", "0")) > 0
