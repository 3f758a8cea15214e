"""Tiered storage through real brokers (docs/tiered_storage.md): name servers and brokers as
processes, moto's S3 server as the object store (tests/object_store_fixture.py), SDK and official
RocketMQ 5 clients and Spark as the readers.

- one broker's topics, tiered and gone from local disk, read back whole: SDK pulls (byte for
  byte, in queue order), queries by key and id and searches by time, POP receives of the v5
  client (every message, acknowledged; and a rare tag's, which reads far past the tier's
  read-ahead for each match), a Spark batch read; a timed and a delayed message whose records
  were tiered before they were due are delivered;
- kill -9 during a multipart upload: the restarted broker aborts the torn upload, uploads the
  file again, and loses nothing;
- the object store away (SIGSTOP): sends go on at their usual latency, nothing unuploaded leaves
  local disk, the runtime info names the error; back, the backlog is uploaded;
- failover (SYNC_MASTER + slave, leases in the control plane's PostgreSQL): the new master goes
  on uploading where the old one stopped; a slave never uploads;
- a bad tier setting stops the broker at start, naming the setting.

Local retention is ``local_retention_hours=0.0003`` (about 1 s), offload and retention rounds
every 100-200 ms, CommitLog files of 256 KiB (32 MiB where an upload must take several parts).
Every wait is a poll with a deadline. Bodies are random hex text (the seeds are printed, and
replayed with ORBIT_TEST_SEED), so the v5 client's text view of a body is byte for byte too.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import os
import random
import statistics
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest

from data_plane.local_object_store import LocalObjectStore, credential_environment
from data_plane.remoting.codes import RequestCode
from data_plane.remoting.command import RemotingCommand
from data_plane.store.message import decode_message_id
from sdk import Message, MessageExt, MessageQueue, OrbitError, Producer, PullConsumer, SendStatus, protocol
from sdk.admin import AdminClient
from tests import rocketmq5_client as v5
from tests.fault.ha_group import new_group
from tests.integration.conftest import SMALL_STORE, ServerProcess, spawn
from tests.integration.helpers import NO_DISK_POLICY, until
from tests.integration.rocketmq5_endpoint import Endpoint
from tests.integration.spark_support import SparkHandle, spark_fixture  # noqa: F401
from tests.object_store_fixture import object_store_fixture, tier_bucket_fixture  # noqa: F401
from tests.postgres_fixture import (  # noqa: F401
    ControlPlaneHarness,
    control_plane_fixture,
    postgres_dsn_fixture,
    postgres_server_fixture,
)

pytestmark = [pytest.mark.integration]

KIB = 1024
MIB = 1024 * KIB
FILE_BYTES = 256 * KIB
PREFIX = "orbit"
CLUSTER = "DefaultCluster"
DEADLINE_S = 30.0


def tier_flags(endpoint: str, bucket: str, **store: object) -> list[str]:
    """Broker flags for a tier in ``bucket``: small files, ~1 s of local retention, quick rounds,
    a small memory cache and no directory cache (so a read of the tier GETs what it reads)."""
    values: dict[str, object] = {
        "tier_url": f"s3://{bucket}/{PREFIX}",
        "tier_endpoint_url": endpoint,
        "commit_log_file_size_bytes": FILE_BYTES,
        "max_message_size_bytes": 64 * KIB,
        "local_retention_hours": 0.0003,
        "tier_check_interval_ms": 100,
        "clean_resource_interval_ms": 200,
        "tier_read_chunk_bytes": 32 * KIB,
        "tier_read_ahead_chunks": 2,
        "tier_cache_memory_bytes": 384 * KIB,
        "tier_cache_dir_bytes": 0,
        "tier_request_timeout_ms": 5000,
    }
    values.update(store)
    flags = [*SMALL_STORE, *NO_DISK_POLICY]
    for k, v in values.items():
        flags += ["--store-set", f"{k}={v}"]
    return flags


# --- messages ---------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Sent:
    topic: str
    queue_id: int
    queue_offset: int
    msg_id: str  # the producer's (UNIQ_KEY)
    offset_msg_id: str  # the broker's (store host + CommitLog offset)
    key: str
    body: bytes
    tag: str | None = None


def body_of(rng: random.Random, topic: str, i: int, size: int) -> bytes:
    head = f"{topic}:{i:06d}:".encode()
    return head + rng.randbytes(max(1, (size - len(head)) // 2)).hex().encode()


async def produce(
    namesrv_addr: str, topic: str, count: int, rng: random.Random, *, size: tuple[int, int] = (300, 2500),
    queues: int = 4, start: int = 0, concurrency: int = 8, acked_only: bool = False,
    latencies_s: list[float] | None = None, tag: Callable[[int], str] | None = None,
) -> list[Sent]:  # fmt: skip
    """``count`` messages of ``topic`` (made with ``queues`` queues), a key each (and the tag
    ``tag(i)``), ``concurrency`` sends at a time: the acknowledged ones (SEND_OK). Every one must
    be, unless ``acked_only`` (then the others, and sends that fail, are left out). Each send's
    seconds go to ``latencies_s``."""
    bodies = [body_of(rng, topic, i, rng.randint(*size)) for i in range(start, start + count)]
    sent: list[Sent] = []
    name = f"p-{uuid.uuid4().hex[:6]}"
    async with Producer("tier-producer", namesrv_addrs=namesrv_addr, instance_name=name) as p:
        await p.create_topic(topic, queue_nums=queues)
        gate = asyncio.Semaphore(concurrency)

        async def one(i: int, body: bytes) -> None:
            key = f"{topic}-k{i}"
            async with gate:
                began = time.monotonic()
                try:
                    r = await p.send(Message(topic, body, keys=key, tags=tag(i) if tag else None))
                except OrbitError:
                    if acked_only:
                        return
                    raise
                if latencies_s is not None:
                    latencies_s.append(time.monotonic() - began)
            if r.status is not SendStatus.SEND_OK:
                assert acked_only, r
                return
            q = r.message_queue.queue_id
            sent.append(Sent(topic, q, r.queue_offset, r.msg_id, r.offset_msg_id, key, body, tag(i) if tag else None))

        await asyncio.gather(*(one(start + n, b) for n, b in enumerate(bodies)))
    return sent


def by_queue(sent: list[Sent]) -> dict[int, list[Sent]]:
    out: dict[int, list[Sent]] = {}
    for s in sorted(sent, key=lambda s: (s.queue_id, s.queue_offset)):
        out.setdefault(s.queue_id, []).append(s)
    return out


async def pull_all(namesrv_addr: str, topic: str, expect: int, *, group: str, queues: int = 4) -> list[MessageExt]:
    """Every message of ``topic`` (of broker-a's ``queues`` queues) through an SDK pull consumer
    of a new group, from each queue's first offset; fails if fewer than ``expect`` arrive in time."""
    got: list[MessageExt] = []
    c = PullConsumer(group, namesrv_addrs=namesrv_addr, instance_name=group, consume_from="FIRST_OFFSET")
    c.assign([MessageQueue(topic, "broker-a", q) for q in range(queues)])
    await c.start()
    try:
        deadline = time.monotonic() + DEADLINE_S
        while len(got) < expect:
            assert time.monotonic() < deadline, f"pulled {len(got)} of {expect} messages of {topic}"
            got.extend(await c.poll(timeout_ms=500))
    finally:
        await c.shutdown()
    return got


def assert_same_queues(got: list[MessageExt], sent: list[Sent]) -> None:
    """``got`` is ``sent`` exactly: each queue from offset 0, in order, every body byte for byte."""
    want = by_queue(sent)
    have: dict[int, list[MessageExt]] = {}
    for m in got:
        have.setdefault(m.queue_id, []).append(m)
    assert sorted(have) == sorted(want)
    for q, msgs in want.items():
        mine = have[q]
        assert [m.queue_offset for m in mine] == list(range(len(msgs))), f"queue {q} in order, from 0, no gap"
        assert [m.queue_offset for m in msgs] == list(range(len(msgs)))
        for m, s in zip(mine, msgs, strict=True):
            assert (m.msg_id, m.body) == (s.msg_id, s.body), f"queue {q} offset {m.queue_offset}"


# --- the broker's figures ---------------------------------------------------------------------------
async def runtime(admin: AdminClient, addr: str) -> dict[str, str]:
    return await admin.broker_status(addr)


def figure(info: dict[str, str], name: str) -> int:
    return int(info[name])


def manifest_of(store: LocalObjectStore, bucket: str, broker: str = "broker-a") -> dict[str, Any]:
    client = store.client()
    try:
        got = client.get_object(Bucket=bucket, Key=f"{PREFIX}/{CLUSTER}.{broker}/manifest.json")
        doc: dict[str, Any] = orjson.loads(got["Body"].read())
        return doc
    finally:
        client.close()


def unfinished_uploads(store: LocalObjectStore, bucket: str) -> list[dict[str, Any]]:
    client = store.client()
    try:
        return list(client.list_multipart_uploads(Bucket=bucket).get("Uploads", []))
    finally:
        client.close()


def assert_contiguous(files: list[dict[str, Any]], file_bytes: int) -> None:
    """The manifest's files are one run from offset 0, a CommitLog file each."""
    assert [f["from"] for f in files] == [i * file_bytes for i in range(len(files))], [f["from"] for f in files]


async def wait_tiered(admin: AdminClient, addr: str, *, files: int, local_from: int) -> dict[str, str]:
    """Until ``files`` files are in the tier and the local log starts at ``local_from`` or later;
    the runtime info then."""
    last: dict[str, str] = {}

    async def done() -> bool:
        nonlocal last
        last = await runtime(admin, addr)
        return figure(last, "tier.tieredFiles") >= files and figure(last, "commitLogMinOffset") >= local_from

    try:
        await until(done, f"{files} files tiered and the local log from {local_from}", timeout_s=DEADLINE_S)
    except BaseException:
        print("runtime info:", {k: v for k, v in last.items() if k.startswith(("tier.", "commitLog", "messages"))})
        raise
    return last


# --- one tiered topic, shared by the readers' tests ---------------------------------------------------
TOPIC = "Cold"
POP_TOPIC = "ColdPop"
COLD_COUNT = 1200
POP_COUNT = 160
LATER_TOPIC = "ColdLater"
LATER_S = 10  # delay level 3


def pop_tag(i: int) -> str:
    """POP_TOPIC's tags: one message in ten is ``rare``."""
    return "rare" if i % 10 == 0 else "common"


@dataclass
class Tiered:
    namesrv: ServerProcess
    broker: ServerProcess
    sent: list[Sent]  # TOPIC's
    pop_sent: list[Sent]  # POP_TOPIC's
    local_from: int  # the local log's first offset once everything above was tiered
    rng: random.Random  # the fixture's (its seed printed), for the tests' samples
    later: list[Sent]  # LATER_TOPIC's: a timed message and one of a delay level, sent first
    later_due_ms: int  # neither is due before this
    tiered_at_ms: int  # when the local log's start was seen past everything above

    @property
    def addr(self) -> str:
        return self.namesrv.address

    def tiered_only(self, sent: list[Sent]) -> list[Sent]:
        """The messages of ``sent`` no longer on the broker's local disk."""
        return [s for s in sent if decode_message_id(s.offset_msg_id)[2] < self.local_from]


async def send_later(namesrv_addr: str, rng: random.Random) -> tuple[list[Sent], int]:
    """A message timed ``LATER_S`` ahead and one of delay level 3 (as long) to LATER_TOPIC; and
    a time before which neither is due."""
    async with Producer("tier-later", namesrv_addrs=namesrv_addr, instance_name="tier-later") as p:
        await p.create_topic(LATER_TOPIC, queue_nums=1)
        due_ms = int(time.time() * 1000) + LATER_S * 1000
        timed = Message(LATER_TOPIC, body_of(rng, LATER_TOPIC, 0, 500), keys="later-0", deliver_at_ms=due_ms)
        delayed = Message(LATER_TOPIC, body_of(rng, LATER_TOPIC, 1, 500), keys="later-1", delay_level=3)
        out = []
        for m in (timed, delayed):
            r = await p.send(m)
            assert r.status is SendStatus.SEND_OK, r
            out.append(Sent(LATER_TOPIC, 0, -1, r.msg_id, r.offset_msg_id, m.keys[0], m.body))
    return out, due_ms


@contextlib.contextmanager
def aws_environment(store: LocalObjectStore) -> Iterator[None]:
    """The object store's credentials in this process's environment (brokers started meanwhile
    inherit them), and nothing else of AWS."""
    with pytest.MonkeyPatch.context() as mp:
        for k in [k for k in os.environ if k.startswith("AWS_")]:
            mp.delenv(k)
        for k, v in credential_environment(store.region).items():
            mp.setenv(k, v)
        yield


@pytest.fixture(scope="module")
def tiered(object_store: LocalObjectStore, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tiered]:
    """A name server and a broker (with its gRPC endpoint) whose topics TOPIC (4 queues) and
    POP_TOPIC (2 queues, its messages spread among TOPIC's), and before them LATER_TOPIC's held
    messages, were sent, sealed into files, uploaded, and deleted from local disk: only the
    active file is local."""
    # (the ``seed`` fixture's rule, for a fixture of the module)
    seed = int(os.environ.get("ORBIT_TEST_SEED", random.SystemRandom().randrange(2**32)))
    print(f"\n[seed] {__name__} tiered: ORBIT_TEST_SEED={seed}")
    rng = random.Random(seed)
    tmp = tmp_path_factory.mktemp("tiered")
    bucket = f"t-{uuid.uuid4().hex[:20]}"
    object_store.create_bucket(bucket)
    started: list[ServerProcess] = []
    try:
        with aws_environment(object_store):
            ns = spawn("namesrv", ["--listen", "127.0.0.1:0"], tmp / "run")
            started.append(ns)
            broker = spawn(
                "broker",
                ["--listen", "127.0.0.1:0", "--namesrv", ns.address, "--broker-name", "broker-a",
                 "--store-dir", str(tmp / "store"), "--set", "grpc_listen=127.0.0.1:0",
                 *tier_flags(object_store.endpoint_url, bucket)],
                tmp / "run",
            )  # fmt: skip
            started.append(broker)

        async def fill() -> Tiered:
            later, due_ms = await send_later(ns.address, rng)
            # The POP topic's messages go out in slices between the other topic's, so that they
            # lie all through the tiered files.
            sent: list[Sent] = []
            pop: list[Sent] = []
            slices = 8
            for _ in range(slices):
                sent += await produce(ns.address, TOPIC, COLD_COUNT // slices, rng, start=len(sent))
                pop += await produce(
                    ns.address, POP_TOPIC, POP_COUNT // slices, rng, queues=2, start=len(pop), tag=pop_tag
                )  # fmt: skip
            async with AdminClient(ns.address) as admin:
                info = await runtime(admin, broker.address)
                active_from = figure(info, "commitLogMaxOffset") // FILE_BYTES * FILE_BYTES
                assert active_from >= 4 * FILE_BYTES, "at least four sealed files"
                info = await wait_tiered(admin, broker.address, files=active_from // FILE_BYTES, local_from=active_from)
            assert figure(info, "messagesFromOffset") == 0, "the tier holds everything before the local log"
            local_from = figure(info, "commitLogMinOffset")
            return Tiered(ns, broker, sent, pop, local_from, rng, later, due_ms, int(time.time() * 1000))

        yield asyncio.run(fill())
    finally:
        for p in reversed(started):
            p.stop()
        object_store.delete_bucket(bucket)


@pytest.mark.asyncio
async def test_a_consumer_from_offset_zero_gets_every_tiered_message_byte_for_byte(tiered: Tiered) -> None:
    cold = tiered.tiered_only(tiered.sent)
    assert len(cold) > 0.7 * len(tiered.sent), "most of the topic is only in the tier"
    async with AdminClient(tiered.addr) as admin:
        gets_before = figure(await runtime(admin, tiered.broker.address), "tier.gets")
        got = await pull_all(tiered.addr, TOPIC, len(tiered.sent), group="cold-readers")
        info = await runtime(admin, tiered.broker.address)
    assert_same_queues(got, tiered.sent)
    # The bytes came from the object store: the local log starts after them, and reading them
    # took ranged GETs (the memory cache, 1 MiB, holds less than the tier).
    assert figure(info, "commitLogMinOffset") >= tiered.local_from
    assert figure(info, "tier.gets") > gets_before
    assert info["tier.tierError"] == ""


@pytest.mark.asyncio
async def test_queries_by_key_and_id_and_searches_by_time_find_tiered_messages(tiered: Tiered) -> None:
    sample = tiered.rng.sample(tiered.tiered_only(tiered.sent), 12)
    async with AdminClient(tiered.addr) as admin:
        for s in sample:
            by_key = await admin.query_by_key(TOPIC, s.key)
            assert [(m.body, m.queue_id, m.queue_offset) for m in by_key] == [(s.body, s.queue_id, s.queue_offset)]
            by_offset_id = await admin.view_message(s.offset_msg_id)
            assert (by_offset_id.body, by_offset_id.keys) == (s.body, [s.key])
            by_unique_id = await admin.view_message(s.msg_id, TOPIC)
            assert (by_unique_id.body, by_unique_id.msg_id) == (s.body, s.offset_msg_id)
    # Time: a sampled message's store time leads to the first message of its queue stored at
    # that millisecond or later; a millisecond later, to the first stored after it (the search's
    # probes fall on tiered records).
    stamps: dict[int, list[int]] = {}
    for m in await pull_all(tiered.addr, TOPIC, len(tiered.sent), group="cold-times"):
        stamps.setdefault(m.queue_id, []).append(m.store_timestamp_ms)
    c = PullConsumer("cold-search", namesrv_addrs=tiered.addr, instance_name="cold-search")
    c.assign([MessageQueue(TOPIC, "broker-a", q) for q in stamps])
    await c.start()
    try:
        for s in sample:
            mq = MessageQueue(TOPIC, "broker-a", s.queue_id)
            times = stamps[s.queue_id]
            ts = times[s.queue_offset]
            assert await c.search_offset(mq, ts) == bisect.bisect_left(times, ts) <= s.queue_offset
            assert await c.search_offset(mq, ts + 1) == bisect.bisect_right(times, ts) > s.queue_offset
        assert await c.search_offset(MessageQueue(TOPIC, "broker-a", 0), 0) == 0
    finally:
        await c.shutdown()


@pytest.mark.asyncio
async def test_a_tiered_messages_trace_is_found(tiered: Tiered) -> None:
    """QUERY_MESSAGE_TRACE of messages only in the tier (from the middle of it, not in memory):
    the broker fetches the record, and the trace has its stored event."""
    cold = sorted(tiered.tiered_only(tiered.sent), key=lambda s: decode_message_id(s.offset_msg_id)[2])
    async with AdminClient(tiered.addr) as admin:
        for s in cold[len(cold) // 3 : len(cold) // 3 + 3]:
            for msg_id in (s.offset_msg_id, s.msg_id):
                events = await admin.message_trace(TOPIC, msg_id)
                stored = [e for e in events if e["event"] == "stored"]
                assert [(e["msgId"], e["queueOffset"]) for e in stored] == [(s.offset_msg_id, s.queue_offset)]


@pytest.mark.asyncio
async def test_a_tiered_message_sent_back_reaches_the_dead_letter_queue_whole(tiered: Tiered) -> None:
    """CONSUMER_SEND_MSG_BACK of messages only in the tier, from the middle of it (far from the
    timed messages' chunks the schedule fetched, and from what other tests read last: not in the
    small memory cache): the broker fetches each and stores its copy."""
    group = "cold-send-back"
    cold = sorted(tiered.tiered_only(tiered.sent), key=lambda s: decode_message_id(s.offset_msg_id)[2])
    middle = cold[len(cold) // 2 : len(cold) // 2 + 3]
    c = PullConsumer(group, namesrv_addrs=tiered.addr, instance_name=group)
    c.assign([MessageQueue(TOPIC, "broker-a", 0)])
    await c.start()
    try:
        for s in middle:
            cmd = RemotingCommand(
                RequestCode.CONSUMER_SEND_MSG_BACK,
                ext_fields={
                    "offset": str(decode_message_id(s.offset_msg_id)[2]), "group": group, "delayLevel": "-1",
                    "originMsgId": s.msg_id, "originTopic": TOPIC, "unitMode": "false", "maxReconsumeTimes": "16",
                },
            )  # fmt: skip
            protocol.check(await c.instance.invoke(tiered.broker.address, cmd), tiered.broker.address)
    finally:
        await c.shutdown()
    got = await pull_all(tiered.addr, f"%DLQ%{group}", len(middle), group=f"{group}-dlq", queues=1)
    assert sorted(m.body for m in got) == sorted(s.body for s in middle)


@pytest.fixture
def v5_endpoint(tiered: Tiered, tmp_path: Path) -> Endpoint:
    v5.client_python()
    return Endpoint(tiered.broker, tmp_path / "client-home")


@pytest.mark.asyncio
async def test_a_v5_simple_consumer_receives_and_acknowledges_every_tiered_message(
    tiered: Tiered, v5_endpoint: Endpoint
) -> None:
    assert len(tiered.tiered_only(tiered.pop_sent)) > 0.7 * len(tiered.pop_sent)
    await v5_endpoint.group("cold-pop")
    got = v5_endpoint.run("simple", topic=POP_TOPIC, group="cold-pop", count=POP_COUNT, timeout_s=40)
    assert got["errors"] == []
    want = {s.msg_id: s.body.decode() for s in tiered.pop_sent}
    assert sorted(m["message_id"] for m in got["received"]) == sorted(want), "each message once"
    assert all(m["body"] == want[m["message_id"]] and not m["corrupted"] for m in got["received"])
    # Every one was acknowledged: the group gets nothing more.
    again = v5_endpoint.run("simple", topic=POP_TOPIC, group="cold-pop", count=1, timeout_s=3, await_s=1)
    assert again["received"] == []


@pytest.mark.asyncio
async def test_a_v5_consumer_of_a_rare_tag_gets_each_tiered_match_without_waiting_out_its_long_polls(
    tiered: Tiered, v5_endpoint: Endpoint
) -> None:
    # Nine messages in ten are filtered out: a receive reads past many tiered messages (more than
    # one read-ahead of the tier) for each one it hands out. Each receive's long poll is 10 s: a
    # receive that waited it out with tiered messages still unread would not finish in time.
    rare = [s for s in tiered.pop_sent if s.tag == "rare"]
    await v5_endpoint.group("cold-pop-rare")
    began = time.monotonic()
    got = v5_endpoint.run(
        "simple", topic=POP_TOPIC, group="cold-pop-rare", expression="rare", count=len(rare), await_s=10,
        timeout_s=20,
    )  # fmt: skip
    took = time.monotonic() - began
    print(f"received {len(got['received'])} of {len(rare)} in {took:.1f} s")
    assert got["errors"] == []
    assert sorted(m["message_id"] for m in got["received"]) == sorted(s.msg_id for s in rare)


def test_a_spark_batch_read_returns_every_tiered_message(tiered: Tiered, spark: SparkHandle) -> None:
    df = spark.session.read.format("orbit").option("namesrv", tiered.addr).option("topic", TOPIC).load()
    rows = {(r.queue_id, r.queue_offset): (r.msg_id, bytes(r.body)) for r in df.select(
        "queue_id", "queue_offset", "msg_id", "body").collect()}  # fmt: skip
    assert rows == {(s.queue_id, s.queue_offset): (s.msg_id, s.body) for s in tiered.sent}


# --- a broker of its own, in the test's bucket --------------------------------------------------------
async def pull_from(admin: AdminClient, addr: str, topic: str, starts: dict[int, int]) -> list[MessageExt]:
    """The messages of ``topic``'s queues from ``starts[queue]`` to their ends, read with pulls
    straight from the broker at ``addr`` (CRC checked)."""
    out: list[MessageExt] = []
    for q, start in starts.items():
        mq = MessageQueue(topic, "broker-a", q)
        offset = start
        while True:
            cmd = protocol.pull_request(
                group="tier-check", mq=mq, offset=offset, max_nums=64, subscription="*", sub_version=0,
                suspend_timeout_ms=0, commit_offset=0, suspend=False, expression_type="TAG",
            )  # fmt: skip
            r = protocol.parse_pull_response(
                await admin.client.invoke(addr, cmd, 5000), "broker-a", addr, check_crc=True
            )
            if not r.messages:
                break
            out += r.messages
            offset = r.next_begin_offset
    return out


@pytest.mark.fault
@pytest.mark.asyncio
async def test_kill_9_during_an_upload_costs_the_upload_and_no_message(
    object_store: LocalObjectStore, tier_bucket: tuple[str, str], namesrv: ServerProcess,
    start_broker: Callable[..., ServerProcess], seed: int,
) -> None:  # fmt: skip
    endpoint, bucket = tier_bucket
    rng = random.Random(seed)
    big = 32 * MIB  # a file uploads in 7 parts of 5 MiB
    flags = tier_flags(
        endpoint, bucket, commit_log_file_size_bytes=big, max_message_size_bytes=MIB, tier_upload_part_bytes=5 * MIB,
        tier_read_chunk_bytes=MIB, tier_cache_memory_bytes=8 * MIB,
    )  # fmt: skip
    # Paced to 8 MiB/s, the upload takes ~4 s, a part ~0.6 s: the watcher below sees the first
    # part long before the last one, so the object store is frozen mid-upload, never after it.
    broker = start_broker(namesrv.address, *flags, "--store-set", f"tier_upload_bytes_per_s={8 * MIB}")
    # Watch the bucket: once the first file's upload has a part in, freeze the object store
    # (SIGSTOP), so that the upload is surely unfinished when the broker dies.
    caught: dict[str, Any] = {}

    def watch() -> None:
        client = object_store.client(timeout_s=2)
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                for u in client.list_multipart_uploads(Bucket=bucket).get("Uploads", []):
                    parts = client.list_parts(Bucket=bucket, Key=u["Key"], UploadId=u["UploadId"]).get("Parts", [])
                    if parts:
                        object_store.pause()
                        caught.update(key=u["Key"], upload_id=u["UploadId"], parts=len(parts))
                        return
                time.sleep(0.005)
        finally:
            client.close()

    watcher = asyncio.create_task(asyncio.to_thread(watch))
    sent = await produce(namesrv.address, "Big", 720, rng, size=(40_000, 60_000))
    await watcher
    assert caught, "no upload was seen under way"
    broker.kill()
    object_store.resume()
    print(f"killed with {caught['parts']} of 7 parts of {caught['key']} uploaded")
    assert caught["parts"] < 7
    assert caught["key"] == f"{PREFIX}/{CLUSTER}.broker-a/commitlog/{0:020d}"
    # The upload is left unfinished: no object, no manifest entry.
    assert [u["UploadId"] for u in unfinished_uploads(object_store, bucket)] == [caught["upload_id"]]
    client = object_store.client()
    try:
        assert "Contents" not in client.list_objects_v2(Bucket=bucket, Prefix=caught["key"])
    finally:
        client.close()

    again = start_broker(namesrv.address, *flags)  # the same store directory
    async with AdminClient(namesrv.address) as admin:
        await wait_tiered(admin, again.address, files=1, local_from=big)
        info = await runtime(admin, again.address)
        assert figure(info, "tier.uploadedFiles") == 1
        # Its first round aborted the torn upload; the file went up again, whole.
        assert unfinished_uploads(object_store, bucket) == []
        (entry,) = manifest_of(object_store, bucket)["files"]
        assert (entry["from"], entry["key"]) == (0, caught["key"])
        client = object_store.client()
        try:
            head = client.head_object(Bucket=bucket, Key=caught["key"])
        finally:
            client.close()
        assert (head["ContentLength"], head["ETag"]) == (entry["size"], entry["etag"])
        assert big - 64 * KIB < entry["size"] <= big
    # Every message, from the tier now that the local file is gone.
    assert_same_queues(await pull_all(namesrv.address, "Big", len(sent), group="big-readers"), sent)


@pytest.mark.asyncio
async def test_an_object_store_away_blocks_no_send_and_deletes_nothing_unuploaded(
    object_store: LocalObjectStore, tier_bucket: tuple[str, str], namesrv: ServerProcess,
    start_broker: Callable[..., ServerProcess], seed: int,
) -> None:  # fmt: skip
    endpoint, bucket = tier_bucket
    rng = random.Random(seed)
    timeout_s = 1.5  # an object-store request that gets no answer fails after this (3 attempts)
    broker = start_broker(namesrv.address, *tier_flags(endpoint, bucket, tier_request_timeout_ms=int(timeout_s * 1000)))
    topic = "Away"
    async with AdminClient(namesrv.address) as admin:
        before_s: list[float] = []
        sent = await produce(namesrv.address, topic, 80, rng, size=(6000, 10000), concurrency=1, latencies_s=before_s)
        info = await runtime(admin, broker.address)
        active = figure(info, "commitLogMaxOffset") // FILE_BYTES * FILE_BYTES
        await wait_tiered(admin, broker.address, files=active // FILE_BYTES, local_from=active)
        hot_from = {q: len(msgs) for q, msgs in by_queue(sent).items()}

        object_store.pause()
        during_s: list[float] = []
        more = await produce(
            namesrv.address, topic, 120, rng, size=(6000, 10000), concurrency=1, latencies_s=during_s, start=len(sent)
        )  # fmt: skip
        ended = time.monotonic()
        print(f"send latency before: median {statistics.median(before_s) * 1000:.1f} ms, max "
              f"{max(before_s) * 1000:.1f} ms; object store away: median {statistics.median(during_s) * 1000:.1f} ms, "
              f"max {max(during_s) * 1000:.1f} ms")  # fmt: skip
        # No send waited on the object store: any that had would have taken a whole request timeout.
        assert max(during_s) < timeout_s * 2 / 3
        info = await runtime(admin, broker.address)
        sealed = figure(info, "commitLogMaxOffset") // FILE_BYTES - active // FILE_BYTES
        assert sealed >= 2, "files were sealed while the object store was away"

        async def stuck() -> bool:
            i = await runtime(admin, broker.address)
            assert figure(i, "commitLogMinOffset") == active, "a file left local disk before its upload"
            return bool(i["tier.tierError"]) and figure(i, "tier.waitingFiles") == sealed

        await until(stuck, "the object store's error and the waiting files in the runtime info", timeout_s=DEADLINE_S)
        # Past local retention (~1 s) and a few retention rounds, the files are still all here:
        # watched every 100 ms until then.
        while time.monotonic() < ended + 0.0003 * 3600 + 1.0:
            assert figure(await runtime(admin, broker.address), "commitLogMinOffset") == active
            await asyncio.sleep(0.1)
        # Reads of what is still local go on without the object store.
        hot = await pull_from(admin, broker.address, topic, hot_from)
        assert sorted((m.queue_id, m.queue_offset, m.body) for m in hot) == sorted(
            (s.queue_id, s.queue_offset, s.body) for s in more
        )

        object_store.resume()
        new_active = figure(await runtime(admin, broker.address), "commitLogMaxOffset") // FILE_BYTES * FILE_BYTES
        info = await wait_tiered(admin, broker.address, files=new_active // FILE_BYTES, local_from=new_active)
        assert (info["tier.tierError"], figure(info, "tier.waitingFiles")) == ("", 0)
        assert_contiguous(manifest_of(object_store, bucket)["files"], FILE_BYTES)
    assert_same_queues(await pull_all(namesrv.address, topic, len(sent) + len(more), group="away-readers"), sent + more)


def test_a_bad_tier_setting_stops_the_broker_at_start_naming_it(start_broker: Callable[..., ServerProcess]) -> None:
    with pytest.raises(RuntimeError, match=r"tier_url must look like s3://bucket/prefix"):
        start_broker(None, "--store-set", "tier_url=http://x")
    with pytest.raises(RuntimeError, match=r"tier_check_interval_ms must be 100\.\.3600000"):
        start_broker(None, "--store-set", "tier_url=s3://bucket-a/p", "--store-set", "tier_check_interval_ms=5")


@pytest.mark.fault
@pytest.mark.asyncio
async def test_after_a_failover_the_new_master_goes_on_uploading_where_the_old_one_stopped(
    object_store: LocalObjectStore, tier_bucket: tuple[str, str], control_plane: ControlPlaneHarness,
    namesrv: ServerProcess, start_broker: Callable[..., ServerProcess], tmp_path: Path, seed: int,
) -> None:  # fmt: skip
    endpoint, bucket = tier_bucket
    rng = random.Random(seed)
    topic = "Failover"
    group = await new_group(
        control_plane, namesrv, start_broker, tmp_path, role="SYNC_MASTER", flush="ASYNC_FLUSH",
        extra=tuple(tier_flags(endpoint, bucket)),
    )  # fmt: skip
    admin = group.admin
    assert admin is not None
    try:
        old, slave = group.members[0].address, group.members[1].address
        sent = await produce(namesrv.address, topic, 700, rng)
        active = figure(await runtime(admin, old), "commitLogMaxOffset") // FILE_BYTES * FILE_BYTES

        async def followed() -> bool:
            """The slave learns the manifest from the bucket, and uploads nothing itself."""
            s = await runtime(admin, slave)
            assert (s["brokerRole"], figure(s, "tier.uploadedFiles")) == ("SLAVE", 0)
            return figure(s, "tier.tieredFiles") == active // FILE_BYTES

        await wait_tiered(admin, old, files=active // FILE_BYTES, local_from=active)
        await until(followed, "the slave following the tier's manifest", timeout_s=DEADLINE_S)
        before = manifest_of(object_store, bucket)["files"]
        assert_contiguous(before, FILE_BYTES)

        group.members[0].kill()
        await group.wait_role(1, "SYNC_MASTER", timeout_s=30)

        async def promoted() -> bool:
            route = await admin.route(topic)
            return any(bd["brokerAddrs"].get("0") == slave for bd in route["brokerDatas"])

        await until(promoted, "the new master in the topic's route", timeout_s=DEADLINE_S)
        more = await produce(namesrv.address, topic, 700, rng, start=len(sent), acked_only=True)
        print(f"acknowledged after the failover: {len(more)} of 700")
        assert len(more) > 500
        info = await runtime(admin, slave)
        active2 = figure(info, "commitLogMaxOffset") // FILE_BYTES * FILE_BYTES
        assert active2 >= active + 2 * FILE_BYTES
        info = await wait_tiered(admin, slave, files=active2 // FILE_BYTES, local_from=active2)
        assert figure(info, "tier.uploadedFiles") == (active2 - active) // FILE_BYTES, "the new master's uploads"
        after = manifest_of(object_store, bucket)["files"]
        assert after[: len(before)] == before, "the old master's entries stay as they were"
        assert_contiguous(after, FILE_BYTES)
        # Every acknowledged message, from the new master, whose local log now starts after them.
        read = await pull_from(admin, slave, topic, dict.fromkeys(range(4), 0))
        stored = {(m.queue_id, m.queue_offset): (m.msg_id, m.body) for m in read}
        lost = [s for s in sent + more if stored.get((s.queue_id, s.queue_offset)) != (s.msg_id, s.body)]
        assert not lost, f"{len(lost)} acknowledged messages not read back as sent; the first: {lost[0]}"
    finally:
        await admin.close()


@pytest.mark.asyncio
async def test_timed_and_delayed_messages_whose_records_were_tiered_are_delivered_when_due(tiered: Tiered) -> None:
    # Their records (in the timer's and the delay levels' system topics) left local disk before
    # they were due: each is read back from the tier to be delivered.
    assert tiered.tiered_only(tiered.later) == tiered.later
    assert tiered.tiered_at_ms < tiered.later_due_ms
    async with AdminClient(tiered.addr) as admin:
        got: list[MessageExt] = []

        async def delivered() -> bool:
            nonlocal got
            got = await pull_from(admin, tiered.broker.address, LATER_TOPIC, {0: 0})
            return len(got) >= len(tiered.later)

        await until(delivered, "the timed and the delayed message delivered", timeout_s=LATER_S + DEADLINE_S)
    assert sorted((m.msg_id, m.body) for m in got) == sorted((s.msg_id, s.body) for s in tiered.later)
    assert all(m.store_timestamp_ms >= tiered.later_due_ms - 1000 for m in got), "not before they were due"
