"""data_plane/broker/tenant_storage.py: each tenant's bytes on this broker's disk and in object
storage only, split per queue at the local CommitLog's first offset, on a real MessageStore.

Tiering stands in as what it leaves behind: the oldest CommitLog files are gone from the local
log (``MappedFileQueue.delete_first_files``, as the tier's deletion after upload does) while the
ConsumeQueues keep every unit, so each queue's min offset still reaches back into them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest

from data_plane.broker.tenant_storage import TenantBytes, measure, queue_bytes, range_bytes
from data_plane.store import Message, MessageStore, PutMessageStatus

pytestmark = pytest.mark.unit

FILE_SIZE = 64 * 1024  # small_config's CommitLog file size
# Names of one length and equal bodies: one record size for all, so the sampled estimate is exact.
TOPICS = {
    "acme%orders": {"writeQueueNums": 2},
    "beta%events": {"writeQueueNums": 1},
    "plainorders": {"writeQueueNums": 1},  # in no tenant's namespace: nobody's bytes
}


@dataclass(frozen=True)
class Put:
    topic: str
    queue_id: int
    offset: int  # in the CommitLog
    size: int


def fill(store: MessageStore, files: int) -> list[Put]:
    """~1 KiB messages, to each topic's queues in turn, until the log spans ``files`` files."""
    targets = [(t, q) for t, tc in TOPICS.items() for q in range(tc["writeQueueNums"])]
    puts: list[Put] = []
    while len(store.commit_log.mfq.files) < files:
        topic, q = targets[len(puts) % len(targets)]
        result = store.put_messages_blocking([Message(topic, b"b" * 1000, q)])
        assert result.status is PutMessageStatus.PUT_OK, result
        assert result.append is not None
        puts.append(Put(topic, q, result.append.wrote_offset, result.append.wrote_bytes))
    store.commit_log.mfq.flush_all()
    return puts


def expected(puts: list[Put], local_from: int) -> TenantBytes:
    local: dict[str, int] = {}
    tiered: dict[str, int] = {}
    for p in puts:
        tenant = p.topic.split("%")[0] if "%" in p.topic else None
        if tenant is None:
            continue
        side = local if p.offset >= local_from else tiered
        side[tenant] = side.get(tenant, 0) + p.size
    return TenantBytes(local, tiered)


def test_without_a_tier_every_byte_is_local(make_store: Callable[..., MessageStore]) -> None:
    store = make_store()
    puts = fill(store, 4)
    assert len({p.size for p in puts}) == 1  # so the sampled estimate is exact
    measured = measure(store, TOPICS)
    assert measured == expected(puts, 0)
    assert measured.tiered == {}
    assert set(measured.local) == {"acme", "beta"}  # the untenanted topic is nobody's


def test_units_below_the_local_logs_first_offset_are_tiered(make_store: Callable[..., MessageStore]) -> None:
    store = make_store()
    puts = fill(store, 5)
    before = measure(store, TOPICS)
    store.commit_log.mfq.delete_first_files(2)  # in object storage only, from now on
    local_from = store.commit_log.min_offset()
    assert local_from == 2 * FILE_SIZE
    assert store.min_offset_in_queue("acme%orders", 0) == 0  # the queue still reaches back
    measured = measure(store, TOPICS)
    assert measured == expected(puts, local_from)
    assert measured.tiered["acme"] > 0
    assert measured.tiered["beta"] > 0
    for tenant in ("acme", "beta"):  # moving bytes between tiers neither loses nor adds any
        assert measured.local[tenant] + measured.tiered[tenant] == before.local[tenant]


def test_a_queue_splits_at_its_first_unit_whose_record_is_local(make_store: Callable[..., MessageStore]) -> None:
    store = make_store()
    puts = fill(store, 3)
    cq = store.queues.get("acme%orders", 1)
    assert cq is not None
    mine = [p for p in puts if (p.topic, p.queue_id) == ("acme%orders", 1)]
    size = mine[0].size
    for local_from in (0, mine[0].offset, mine[0].offset + 1, mine[7].offset, mine[-1].offset, 10 * FILE_SIZE):
        tiered_units = sum(p.offset < local_from for p in mine)
        assert queue_bytes(cq, local_from) == ((len(mine) - tiered_units) * size, tiered_units * size), local_from
    assert range_bytes(cq, 5, 5) == 0
    assert range_bytes(cq, 3, 2) == 0
