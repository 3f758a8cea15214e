"""The tier's per-file indexes: with each CommitLog file the offloader uploads an index object (its
ConsumeQueue units and key entries, ``data_plane/store/tier/file_index.py``), and the local
ConsumeQueues and IndexFiles then follow local retention — every read by queue offset, key and
time below them is served from the tier's indexes (moto's S3 server over real HTTP)."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable

import boto3
import pytest

from data_plane.local_object_store import LocalObjectStore
from data_plane.store import Message, MessageStore, PutMessageStatus
from data_plane.store.consume_queue import ConsumeQueue
from data_plane.store.index_file import key_hash
from data_plane.store.layouts import CQ_UNIT
from data_plane.store.message import decode_record
from data_plane.store.tier import file_index
from data_plane.store.tier.object_store import ObjectStoreError
from tests.conftest import ManualClock
from tests.integration import test_tier_store
from tests.integration.test_tier_store import GROUP, HOUR_MS, Put, _fill, _read_queue, _tier_and_drop_local
from tests.object_store_fixture import object_store_fixture, tier_bucket_fixture  # noqa: F401

open_store = test_tier_store.open_store  # (the fixture)


def _units(cq: ConsumeQueue, offset: int, n: int) -> bytes:
    """``n`` units of the local queue from ``offset`` (across its files)."""
    out = b""
    while n > 0:
        found = cq.units(offset, n)
        assert found is not None
        out += bytes(found[0])
        offset, n = offset + found[1], n - found[1]
    return out


def _local_queue_files(store: MessageStore, topic: str) -> int:
    cq = store.queues.get(topic, 0)
    assert cq is not None
    return len(cq.mfq.files)


def _filled_and_tiered(store: MessageStore, clock: ManualClock, files: int = 8) -> list[Put]:
    puts = _fill(store, clock, files)
    cq_files, index_files = _local_queue_files(store, "T"), len(store.index.files) if store.index else 0
    _tier_and_drop_local(store, clock)
    assert store.tier is not None
    assert all(f.index_key for f in store.tier.manifest.files), "every uploaded file has its index"
    assert _local_queue_files(store, "T") < cq_files, "the local ConsumeQueue follows local retention"
    assert store.index is not None
    assert len(store.index.files) < index_files, "the local IndexFiles follow local retention"
    cq = store.queues.get("T", 0)
    assert cq is not None
    assert cq.min_offset_in_queue() > 0, "the local queue no longer reaches the first message"
    assert store.min_offset_in_queue("T", 0) == 0, "the queue still starts at its first message"
    return puts


def test_the_index_objects_are_uploaded_and_hold_each_files_units_and_keys(
    open_store: Callable[..., MessageStore], clock: ManualClock, tier_bucket: tuple[str, str]
) -> None:
    store = open_store()
    puts = _fill(store, clock, 4)
    assert store.tier is not None
    store.tier.offloader.round()
    endpoint, bucket = tier_bucket
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    for f in store.tier.manifest.files:
        assert f.index_key == f"orbit/{GROUP}/index/{f.from_offset:020d}"
        data = s3.get_object(Bucket=bucket, Key=f.index_key)["Body"].read()
        assert len(data) == f.index_size
        head = file_index.parse_head(data)
        assert (head.from_offset, head.units_at, head.keys_at) == (f.from_offset, f.index_head, f.index_keys_at)
        mine = [p for p in puts if f.from_offset <= p.offset < f.from_offset + f.size]
        (r,) = head.ranges
        assert (r.topic, r.queue_id, r.first, r.count) == ("T", 0, mine[0].queue_offset, len(mine))
        cq = store.queues.get("T", 0)
        assert cq is not None
        last = cq.unit(mine[-1].queue_offset)
        assert last is not None
        assert head.size == last[0] + last[1] - f.from_offset, "it indexes the file up to where its records end"
        units = _units(cq, mine[0].queue_offset, len(mine))
        assert data[r.units_at : r.units_at + 20 * r.count] == units, "the units are the local queue's"
        assert r.size == sum(size for _, size, _ in CQ_UNIT.iter_unpack(units))
        assert head.keys == len(mine), "one entry a KEYS key"
        assert (f.oldest_store_ms, f.newest_store_ms >= mine[-1].stored_ms) == (mine[0].stored_ms, True)


def test_pulls_read_every_message_through_the_tiers_indexes_once_the_local_queue_is_gone(
    open_store: Callable[..., MessageStore], clock: ManualClock
) -> None:
    store = open_store()
    puts = _filled_and_tiered(store, clock)
    assert store.tier is not None
    assert asyncio.run(_read_queue(store, "T")) == [p.body for p in puts]
    assert store.tier.index_cache.stats()["gets"] > 0
    # A read that starts in the middle of a tiered range, as a consumer's committed offset does.
    mid = puts[len(puts) // 3]

    async def from_mid() -> list[int]:
        r = store.get_message("T", 0, mid.queue_offset, 4)
        while r.cold and not r.messages:
            await store.fetch_cold_read(r)
            r = store.get_message("T", 0, mid.queue_offset, 4)
        return r.queue_offsets

    assert asyncio.run(from_mid()) == [mid.queue_offset + i for i in range(4)]


def test_queries_by_key_and_time_find_tiered_messages_whose_local_index_is_gone(
    open_store: Callable[..., MessageStore], clock: ManualClock
) -> None:
    store = open_store()
    puts = _filled_and_tiered(store, clock)
    assert store.index is not None
    local_index_from = store.index.begin_phy_offset()
    old = [p for p in puts if p.offset < local_index_from]
    assert len(old) > 20, "the test needs messages whose local index entries are gone"
    assert store.query_message("T", old[5].key) == [], "the local index no longer finds it"

    async def queries() -> None:
        for target in (old[0], old[5], old[-1], puts[-1]):
            found = await store.query_message_cold("T", target.key)
            assert [m.body for m in found] == [target.body], target.key
            at = await store.offset_in_queue_by_time_cold("T", 0, target.stored_ms)
            assert at == target.queue_offset
        # A time range that excludes the message's file finds nothing; another topic neither.
        assert await store.query_message_cold("T", old[5].key, begin_ms=puts[-1].stored_ms + 1) == []
        assert await store.query_message_cold("U", old[5].key) == []
        assert await store.query_message_cold("T", "no-such-key") == []

    asyncio.run(queries())


def test_a_restarted_store_takes_the_heads_from_its_own_disk_without_the_object_store(
    open_store: Callable[..., MessageStore], clock: ManualClock, object_store: LocalObjectStore
) -> None:
    store = open_store()
    puts = _filled_and_tiered(store, clock)
    store.shutdown()
    object_store.pause()
    try:
        again = open_store()
        assert again.tier is not None
        assert again.min_offset_in_queue("T", 0) == 0, "the heads came from local disk"
        r = again.get_message("T", 0, 0, 8)
        assert r.cold, "units not in memory: the read asks for them"
        assert not r.messages
    finally:
        object_store.resume()
    assert asyncio.run(_read_queue(again, "T")) == [p.body for p in puts]


def test_a_follower_fetches_the_heads_it_lacks_and_trims_its_own_queues(
    open_store: Callable[..., MessageStore], clock: ManualClock
) -> None:
    master = open_store("master")
    puts = _fill(master, clock, 6)
    slave = open_store("slave")
    slave.fenced = True
    for mf in master.commit_log.mfq.files:  # (what replication would have copied)
        slave.append_raw(bytes(mf.mv[: mf.wrote_position]), mf.file_from_offset)
    assert slave.commit_log.max_offset() == master.commit_log.max_offset()
    assert master.tier is not None
    assert slave.tier is not None
    master.tier.offloader.round()
    slave.tier.offloader.round()
    assert all(slave.tier.queues.has(f.from_offset) for f in slave.tier.manifest.files)
    clock.advance(2 * HOUR_MS)
    slave.clean_once()
    cq = slave.queues.get("T", 0)
    assert cq is not None
    assert cq.min_offset_in_queue() > 0
    assert asyncio.run(_read_queue(slave, "T")) == [p.body for p in puts]


def test_tier_retention_drops_the_indexes_with_their_files(
    open_store: Callable[..., MessageStore], clock: ManualClock, tier_bucket: tuple[str, str]
) -> None:
    store = open_store()
    puts = _filled_and_tiered(store, clock)
    store.topic_retention_hours = {"T": 3.0}
    clock.advance(1000 * HOUR_MS)
    assert store.tier is not None
    store.tier.offloader.round()
    assert store.tier.manifest.files == []
    assert store.tier.queues.first("T", 0) is None
    assert not os.listdir(os.path.join(store.config.tier_state_path, "index"))
    endpoint, bucket = tier_bucket
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket).get("Contents", [])]
    assert keys == [f"orbit/{GROUP}/manifest.json"], keys
    cq = store.queues.get("T", 0)
    assert cq is not None
    assert store.min_offset_in_queue("T", 0) == cq.min_offset_in_queue() > 0
    r = store.get_message("T", 0, 0, 8)
    assert r.next_begin_offset == cq.min_offset_in_queue(), "a read below the queue's start is sent there"
    assert len(puts) > r.next_begin_offset


def test_build_indexes_a_file_by_the_dispatchers_rules(make_store: Callable[..., MessageStore]) -> None:
    """``file_index.build`` over a real CommitLog file (two topics, two queues, several keys a
    message): the same units as the local ConsumeQueues, and an entry for every KEYS and UNIQ_KEY
    key, each found through its block of the key table."""
    store = make_store()
    for i in range(40):
        props = {"KEYS": f"a-{i} b-{i}", "UNIQ_KEY": f"u-{i}", "TAGS": "t1" if i % 2 else "t2"}
        r = store.put_messages_blocking([Message("X" if i % 3 else "Y", b"body-%d" % i, i % 2, properties=props)])
        assert r.status is PutMessageStatus.PUT_OK
    store.commit_log.mfq.flush_all()
    mf = store.commit_log.mfq.files[0]
    built = file_index.build(mf.path, mf.file_from_offset, mf.wrote_position)
    head = file_index.parse_head(built.data[: built.head.units_at])
    assert head == built.head
    assert head.keys == 120
    for rng in head.ranges:
        cq = store.queues.get(rng.topic, rng.queue_id)
        assert cq is not None
        assert (rng.first, rng.count) == (0, cq.max_offset_in_queue())
        assert built.data[rng.units_at : rng.units_at + 20 * rng.count] == _units(cq, 0, rng.count)
    # Every key's entries are found by its block, and only there.

    for i in (0, 17, 39):
        topic = "X" if i % 3 else "Y"
        h = key_hash(f"{topic}#u-{i}")
        block = head.key_block(h)
        assert block is not None
        first, last = block
        hashes = built.data[file_index.hashes_at(head, first) : file_index.hashes_at(head, last)]
        a, b = file_index.matching(hashes, h)
        assert b - a == 1
        phy = int.from_bytes(built.data[file_index.offsets_at(head, first + a) :][:8], "little", signed=True)
        m = store.look_message_by_offset(phy)
        assert m is not None
        assert m.body == b"body-%d" % i
        assert decode_record(store.read_record(phy)).properties["UNIQ_KEY"] == f"u-{i}"  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "damage",
    [lambda d: b"XXXX" + d[4:], lambda d: d[:40], lambda d: d[:-4]],
    ids=["magic", "cut-short", "length-mismatch"],
)
def test_a_damaged_index_head_is_refused_clearly(damage: Callable[[bytes], bytes]) -> None:
    built = file_index.encode(0, 100, 1, {}, [5, 3], [10, 20])
    head = built.data[: built.head.units_at]
    assert file_index.parse_head(head).keys == 2
    with pytest.raises(file_index.IndexObjectError):
        file_index.parse_head(damage(head))


def test_key_queries_take_the_heads_from_memory_not_the_disk(
    open_store: Callable[..., MessageStore], clock: ManualClock
) -> None:
    store = open_store()
    puts = _filled_and_tiered(store, clock)
    assert store.tier is not None
    heads = os.path.join(store.config.tier_state_path, "index")
    for name in os.listdir(heads):  # a query that read them from disk would find nothing now
        os.unlink(os.path.join(heads, name))
    found = asyncio.run(store.query_message_cold("T", puts[3].key))
    assert [m.body for m in found] == [puts[3].body]


def test_retention_hides_its_files_from_readers_before_publishing_and_shows_them_again_if_it_cannot(
    open_store: Callable[..., MessageStore], clock: ManualClock, object_store: LocalObjectStore
) -> None:
    store = open_store()
    puts = _filled_and_tiered(store, clock)
    tier = store.tier
    assert tier is not None
    files = list(tier.manifest.files)
    store.topic_retention_hours = {"T": 3.0}
    clock.advance(1000 * HOUR_MS)
    failed: list[BaseException] = []

    def retention_round() -> None:
        try:
            tier.offloader.round()
        except BaseException as e:  # the manifest cannot be written: the object store is frozen
            failed.append(e)

    object_store.pause()
    worker = threading.Thread(target=retention_round)
    try:
        worker.start()
        deadline = time.monotonic() + 30
        while tier.queues.first("T", 0) is not None:  # hidden while the manifest is being written
            assert time.monotonic() < deadline, "retention never hid the files it deletes"
            assert worker.is_alive(), "the round ended without hiding the files"
            time.sleep(0.005)
        assert tier.manifest.files == files, "the manifest without them is not published yet"
        worker.join(60)  # the write times out against the frozen store
    finally:
        object_store.resume()
        worker.join(60)
    assert failed, "the round ended without an error: the object store answered"
    assert isinstance(failed[0], ObjectStoreError)
    assert tier.manifest.files == files
    assert tier.queues.first("T", 0) == 0, "the files it could not delete are readable again"
    assert asyncio.run(_read_queue(store, "T")) == [p.body for p in puts]
