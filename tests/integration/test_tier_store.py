"""Tiered storage at the store: sealed CommitLog files go to an S3-compatible object store (moto's
server over real HTTP), local copies leave only once uploaded, and every message reads back —
by queue offset, key, id and time — after its local file is gone (data_plane/store/tier).

The store's clock is a ManualClock moved a minute a put, so each file's age is known; offload
rounds are run by the test (``Offloader.round``) rather than waited for."""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import boto3
import orjson
import pytest

from data_plane.local_object_store import LocalObjectStore
from data_plane.store import Message, MessageStore, PutMessageStatus
from data_plane.store.message import decode_record
from data_plane.store.tier.manifest import Manifest
from data_plane.store.tier.object_store import ObjectStoreError
from tests.conftest import ManualClock, small_config
from tests.object_store_fixture import object_store_fixture, tier_bucket_fixture  # noqa: F401

FILE_SIZE = 64 * 1024  # small_config's CommitLog file size
HOUR_MS = 3_600_000
STEP_MS = 60_000
GROUP = "TestCluster.broker-t"


@dataclass
class Put:
    topic: str
    queue_offset: int
    offset: int
    body: bytes
    key: str
    stored_ms: int


@pytest.fixture
def open_store(
    tmp_path: Path, make_store: Callable[..., MessageStore], tier_bucket: tuple[str, str]
) -> Callable[..., MessageStore]:
    """``open_store(name="a", disk=None, **config changes)``: a started store (conftest's
    ``make_store``) with a tier in the test's bucket."""
    endpoint, bucket = tier_bucket

    def make(name: str = "a", disk: Callable[[str], float] | None = None, **changes: object) -> MessageStore:
        values: dict[str, object] = {
            "tier_url": f"s3://{bucket}/orbit", "tier_endpoint_url": endpoint, "tier_group": GROUP,
            "local_retention_hours": 1.0, "tier_read_chunk_bytes": 16 * 1024, "tier_read_ahead_chunks": 2,
            "tier_request_timeout_ms": 2_000, "tier_check_interval_ms": 3_600_000,
        }  # fmt: skip
        values.update(changes)
        return make_store(str(tmp_path / name), disk, **values)

    return make


def _fill(store: MessageStore, clock: ManualClock, files: int, topics: tuple[str, ...] = ("T",)) -> list[Put]:
    """~1 KiB messages with a key each, the topics in turn, until the log spans ``files`` files."""
    puts: list[Put] = []
    while len(store.commit_log.mfq.files) < files:
        i = len(puts)
        topic = topics[i % len(topics)]
        clock.advance(STEP_MS)
        body = b"%06d" % i + os.urandom(8).hex().encode() * 62
        r = store.put_messages_blocking([Message(topic, body, 0, properties={"KEYS": f"key-{i}"})])
        assert r.status is PutMessageStatus.PUT_OK, r
        assert r.append is not None
        puts.append(Put(topic, r.append.queue_offset, r.append.wrote_offset, body, f"key-{i}", clock.now_ms))
    store.commit_log.mfq.flush_all()
    return puts


def _local_files(store: MessageStore) -> list[int]:
    return [mf.file_from_offset for mf in store.commit_log.mfq.files]


async def _read_queue(store: MessageStore, topic: str, queue_id: int = 0) -> list[bytes]:
    """Every message body of a queue from its min offset, fetching tiered records as a pull does."""
    out: list[bytes] = []
    offset = store.min_offset_in_queue(topic, queue_id)
    while True:
        r = store.get_message(topic, queue_id, offset, 32)
        if r.cold and not r.messages:
            await store.fetch_cold_read(r)
            continue
        if not r.messages:
            return out
        out += [decode_record(m).body for m in r.messages]
        offset = r.next_begin_offset


def _tier_and_drop_local(store: MessageStore, clock: ManualClock) -> None:
    """Upload what is sealed, then let local retention (1 h) take the uploaded files."""
    assert store.tier is not None
    store.tier.offloader.round()
    clock.advance(2 * HOUR_MS)
    store.clean_once()


def test_sealed_files_are_uploaded_verified_and_named_in_the_group_manifest(
    open_store: Callable[..., MessageStore], clock: ManualClock, tier_bucket: tuple[str, str]
) -> None:
    store = open_store()
    _fill(store, clock, 4)
    assert store.tier is not None
    store.tier.offloader.round()
    sealed = store.commit_log.mfq.files[:-1]
    m = store.tier.manifest
    assert [f.from_offset for f in m.files] == [mf.file_from_offset for mf in sealed]
    endpoint, bucket = tier_bucket
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    for mf, f in zip(sealed, m.files, strict=True):
        with open(mf.path, "rb") as fh:
            local = fh.read()[: mf.wrote_position]
        obj = s3.get_object(Bucket=bucket, Key=f.key)
        assert obj["Body"].read() == local, f"object {f.key} differs from the local file"
        assert f.key == f"orbit/{GROUP}/commitlog/{mf.file_from_offset:020d}"
        assert f.topics == ("T",)
    remote = orjson.loads(s3.get_object(Bucket=bucket, Key=f"orbit/{GROUP}/manifest.json")["Body"].read())
    assert [x["from"] for x in remote["files"]] == [f.from_offset for f in m.files]
    # The file being written is not sealed: it stays local only.
    assert not m.has(store.commit_log.mfq.files[-1].file_from_offset)
    # A second round uploads nothing again.
    uploaded = store.tier.offloader.uploaded_files
    store.tier.offloader.round()
    assert store.tier.offloader.uploaded_files == uploaded


def test_every_message_reads_back_byte_for_byte_after_its_local_file_is_gone(
    open_store: Callable[..., MessageStore], clock: ManualClock
) -> None:
    store = open_store()
    puts = _fill(store, clock, 5)
    _tier_and_drop_local(store, clock)
    assert store.tier is not None
    assert len(store.commit_log.mfq.files) == 1, "uploaded files past local retention stay on disk"
    assert store.min_offset_in_queue("T", 0) == 0, "the queue still starts at its first message"
    assert store.log_floor() == 0
    bodies = asyncio.run(_read_queue(store, "T"))
    assert bodies == [p.body for p in puts]
    assert store.tier.cache.gets > 0


def test_hot_reads_never_touch_the_object_store(open_store: Callable[..., MessageStore], clock: ManualClock) -> None:
    store = open_store()
    puts = _fill(store, clock, 4)
    _tier_and_drop_local(store, clock)
    assert store.tier is not None
    local_from = store.commit_log.min_offset()
    first_hot = next(p for p in puts if p.offset >= local_from)
    gets = store.tier.cache.gets
    r = store.get_message("T", 0, first_hot.queue_offset, 1000)
    assert r.cold_offset == -1
    assert len(r.messages) == len(puts) - first_hot.queue_offset
    assert store.tier.cache.gets == gets


def test_queries_by_key_id_and_time_find_tiered_messages(
    open_store: Callable[..., MessageStore], clock: ManualClock
) -> None:
    store = open_store()
    puts = _fill(store, clock, 4)
    _tier_and_drop_local(store, clock)
    target = puts[3]
    assert target.offset < store.commit_log.min_offset(), "the message must be tiered"

    async def queries() -> None:
        found = await store.query_message_cold("T", target.key)
        assert [m.body for m in found] == [target.body]
        by_id = await store.look_message_by_offset_cold(target.offset)
        assert by_id is not None
        assert by_id.body == target.body
        at = await store.offset_in_queue_by_time_cold("T", 0, target.stored_ms)
        assert at == target.queue_offset

    asyncio.run(queries())


def test_local_copies_wait_for_their_upload_at_every_watermark(
    open_store: Callable[..., MessageStore], clock: ManualClock
) -> None:
    disk = DiskReading(0.10)
    store = open_store(disk=disk)
    _fill(store, clock, 4)
    files = _local_files(store)
    clock.advance(2 * HOUR_MS)  # past local retention, inside total retention (72 h)
    store.clean_once()
    assert _local_files(store) == files, "nothing is uploaded yet: nothing may go"
    disk.ratio = 0.80  # pressure
    store.clean_once()
    assert _local_files(store) == files
    disk.ratio = 0.97  # the emergency watermark: writes are refused, nothing is deleted
    report = store.clean_once()
    assert _local_files(store) == files
    assert report.forced == []
    assert store.disk_full
    # Uploaded: under pressure they go at once.
    disk.ratio = 0.80
    assert store.tier is not None
    store.tier.offloader.round()
    store.clean_once()
    assert _local_files(store) == files[-1:]


def test_an_unavailable_object_store_makes_offload_wait_and_loses_nothing(
    open_store: Callable[..., MessageStore], clock: ManualClock, object_store: LocalObjectStore
) -> None:
    store = open_store()
    puts = _fill(store, clock, 4)
    assert store.tier is not None
    object_store.pause()
    try:
        with pytest.raises(ObjectStoreError):
            store.tier.offloader.round()
        clock.advance(2 * HOUR_MS)
        store.clean_once()
        assert len(store.commit_log.mfq.files) == 4, "files not uploaded stay"
        assert store.tier.manifest.files == []
    finally:
        object_store.resume()
    store.tier.offloader.round()
    assert len(store.tier.manifest.files) == 3
    store.clean_once()
    assert len(store.commit_log.mfq.files) == 1
    assert asyncio.run(_read_queue(store, "T")) == [p.body for p in puts]


def test_tier_retention_follows_each_topics_own_retention(
    open_store: Callable[..., MessageStore], clock: ManualClock, tier_bucket: tuple[str, str]
) -> None:
    store = open_store()
    puts = _fill(store, clock, 5, topics=("short%t", "long%t"))
    store.topic_retention_hours = {"short%t": 1.0, "long%t": float("inf")}
    store.retention_hours = float("inf")
    _tier_and_drop_local(store, clock)
    assert store.tier is not None
    tiered = len(store.tier.manifest.files)
    assert tiered == 4
    clock.advance(1000 * HOUR_MS)
    store.tier.offloader.round()
    assert len(store.tier.manifest.files) == tiered, "a file holding an unlimited topic's messages stays"
    store.topic_retention_hours["long%t"] = 2.0
    store.tier.offloader.round()
    assert store.tier.manifest.files == []
    endpoint, bucket = tier_bucket
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket).get("Contents", [])]
    assert keys == [f"orbit/{GROUP}/manifest.json"], keys
    store.clean_once()
    # The queues now start where the local log does.
    local_from = store.commit_log.min_offset()
    for topic in ("short%t", "long%t"):
        gone = sum(1 for p in puts if p.topic == topic and p.offset < local_from)
        assert gone > 0
        assert store.min_offset_in_queue(topic, 0) == gone


def test_a_restarted_store_reads_tiered_messages_from_its_local_manifest(
    open_store: Callable[..., MessageStore], clock: ManualClock
) -> None:
    store = open_store()
    puts = _fill(store, clock, 4)
    _tier_and_drop_local(store, clock)
    store.shutdown()
    again = open_store()
    assert again.tier is not None
    assert len(again.tier.manifest.files) == 3
    assert again.min_offset_in_queue("T", 0) == 0
    assert asyncio.run(_read_queue(again, "T")) == [p.body for p in puts]


def test_a_fenced_store_never_uploads_and_follows_the_masters_manifest(
    open_store: Callable[..., MessageStore], clock: ManualClock
) -> None:
    master = open_store("master")
    _fill(master, clock, 4)
    slave = open_store("slave")
    slave.fenced = True
    assert master.tier is not None
    assert slave.tier is not None
    slave.append_raw(bytes(master.commit_log.read(0, master.commit_log.max_offset()) or b""), 0)
    slave.tier.offloader.round()
    assert slave.tier.offloader.uploaded_files == 0
    assert slave.tier.manifest.files == []
    master.tier.offloader.round()
    slave.tier.offloader.round()
    assert [f.from_offset for f in slave.tier.manifest.files] == [f.from_offset for f in master.tier.manifest.files]
    assert slave.tier.offloader.uploaded_files == 0


def test_an_upload_a_crash_left_unfinished_is_aborted_and_done_again(
    open_store: Callable[..., MessageStore], clock: ManualClock, tier_bucket: tuple[str, str]
) -> None:
    endpoint, bucket = tier_bucket
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    key = f"orbit/{GROUP}/commitlog/{0:020d}"
    started = s3.create_multipart_upload(Bucket=bucket, Key=key)
    s3.upload_part(Bucket=bucket, Key=key, UploadId=started["UploadId"], PartNumber=1, Body=b"half a file")
    store = open_store()
    _fill(store, clock, 3)
    assert store.tier is not None
    store.tier.offloader.round()
    assert s3.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
    obj = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    first = store.commit_log.mfq.files[0]
    assert obj == bytes(first.mv[: first.wrote_position])


def test_the_chunk_cache_keeps_within_its_memory_and_directory_bounds(
    open_store: Callable[..., MessageStore], clock: ManualClock
) -> None:
    store = open_store(
        tier_cache_memory_bytes=6 * 16 * 1024, tier_cache_dir_bytes=5 * 16 * 1024, tier_read_ahead_chunks=2
    )
    puts = _fill(store, clock, 6)
    _tier_and_drop_local(store, clock)
    assert asyncio.run(_read_queue(store, "T")) == [p.body for p in puts]
    assert store.tier is not None
    records, units = store.tier.cache.stats(), store.tier.index_cache.stats()
    assert units["gets"] > 0, "the local queue's units were gone: the tier's index served them"
    assert records["memoryBytes"] + units["memoryBytes"] <= 6 * 16 * 1024
    assert records["diskBytes"] + units["diskBytes"] <= 5 * 16 * 1024
    on_disk = sum(os.path.getsize(os.path.join(d, n)) for d, _, names in os.walk(store.config.tier_cache_path)
                  for n in names)  # fmt: skip
    assert on_disk <= 5 * 16 * 1024


def test_the_manifest_round_trips_and_refuses_another_groups() -> None:
    m = Manifest("g")
    data = m.to_bytes()
    assert Manifest.from_bytes(data, "g").files == []
    with pytest.raises(ValueError, match="belongs to group"):
        Manifest.from_bytes(data, "other")
    with pytest.raises(ValueError, match="not JSON"):
        Manifest.from_bytes(b"{", "g")


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        ({"tier_url": "http://bucket/x"}, "s3://bucket/prefix"),
        ({"tier_url": "s3://Bad_Bucket/x"}, "not a valid S3 bucket name"),
        ({"tier_endpoint_url": "ftp://x"}, "http:// or https://"),
        ({"tier_profile": "a profile"}, "tier_profile"),
        ({"tier_group": ""}, "tier_group"),
        ({"local_retention_hours": 0}, "local_retention_hours"),
        ({"tier_upload_part_bytes": 1024}, "tier_upload_part_bytes"),
        ({"tier_read_chunk_bytes": 100}, "tier_read_chunk_bytes"),
        ({"tier_cache_memory_bytes": 1024}, "tier_cache_memory_bytes"),
    ],
)
def test_tier_settings_are_validated_with_clear_errors(
    tmp_path: Path, changes: dict[str, object], problem: str
) -> None:
    values: dict[str, object] = {"tier_url": "s3://orbit-tier/p", "tier_group": "c.b"}
    values.update(changes)
    with pytest.raises(ValueError, match=re.escape(problem)):
        small_config(str(tmp_path), **values)


class DiskReading:
    def __init__(self, ratio: float) -> None:
        self.ratio = ratio

    def __call__(self, _path: str) -> float:
        return self.ratio


def test_credentials_may_come_from_a_named_profile_of_the_shared_files(
    open_store: Callable[..., MessageStore],
    clock: ManualClock,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    shared = tmp_path / "credentials"
    shared.write_text("[orbit-tier]\naws_access_key_id = testing\naws_secret_access_key = testing\n")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(shared))
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(key, raising=False)
    with pytest.raises(ObjectStoreError, match="tier_profile"):
        open_store("missing", tier_profile="no-such-profile")
    store = open_store(tier_profile="orbit-tier")
    _fill(store, clock, 3)
    assert store.tier is not None
    store.tier.offloader.round()
    assert len(store.tier.manifest.files) == 2


def test_a_record_across_two_chunks_is_read_whole_when_only_its_first_chunk_is_in_memory(
    open_store: Callable[..., MessageStore], clock: ManualClock
) -> None:
    chunk = 16 * 1024
    store = open_store(tier_read_ahead_chunks=0, tier_cache_dir_bytes=0)
    puts = _fill(store, clock, 3)
    _tier_and_drop_local(store, clock)
    across = next(p for p in puts if p.offset // chunk != (p.offset + len(p.body) + 100) // chunk)
    assert store.tier is not None
    tier = store.tier

    async def read() -> None:
        await store.fetch_cold(across.offset, 8)  # the first chunk only: no read-ahead
        assert tier.view(across.offset, 8) is not None
        assert store.cold(across.offset), "the rest of the record is not in memory"
        m = await store.look_message_by_offset_cold(across.offset)
        assert m is not None
        assert m.body == across.body

    asyncio.run(read())
