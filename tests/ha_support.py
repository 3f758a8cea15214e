"""Shared by the HA tests: message generation, whole-log comparison, store geometry."""

from __future__ import annotations

import random

from data_plane.store import GetMessageStatus, Message, MessageStore, PutMessageStatus, StoreConfig
from data_plane.store.message import decode_record

TOPICS = ("HaA", "HaB", "Ha_C")
QUEUES = 3


def ha_config(path: str, **changes: object) -> StoreConfig:
    base: dict[str, object] = {
        "store_path": path,
        "commit_log_file_size_bytes": 256 * 1024,
        "max_message_size_bytes": 64 * 1024,
        "consume_queue_units_per_file": 128,
        "index_hash_slots": 256,
        "index_max_entries": 4096,
        "flush_interval_commit_log_ms": 50,
        "flush_interval_consume_queue_ms": 50,
        "preallocate_next_file": False,
        "reserve_ahead_bytes": 0,
    }
    base.update(changes)
    return StoreConfig(**base)  # type: ignore[arg-type]


def make_message(rng: random.Random, seq: int, tag: str = "m") -> Message:
    roll = rng.random()
    size = rng.randint(8 * 1024, 30 * 1024) if roll < 0.05 else rng.randint(1, 2048)
    return Message(
        topic=TOPICS[seq % len(TOPICS)],
        body=rng.randbytes(size),
        queue_id=rng.randrange(QUEUES),
        properties={"KEYS": f"{tag}-{seq}", "UNIQ_KEY": f"U{tag}{seq:012d}", "TAGS": f"t{seq % 3}"},
        born_timestamp=1_700_000_000_000 + seq,
    )


def put_many(store: MessageStore, rng: random.Random, count: int, start: int = 0, tag: str = "m") -> None:
    for seq in range(start, start + count):
        r, _end = store.append([make_message(rng, seq, tag)])
        assert r.status is PutMessageStatus.PUT_OK, r


def log_bytes(store: MessageStore, upto: int | None = None) -> bytes:
    """The CommitLog's bytes from its min offset (to ``upto``)."""
    cl = store.commit_log
    out = bytearray()
    for mf in cl.mfq.files:
        out += mf.mv[: mf.wrote_position]
    data = bytes(out)
    return data if upto is None else data[: upto - cl.min_offset()]


def queue_contents(store: MessageStore) -> dict[tuple[str, int], list[tuple[int, bytes]]]:
    """Every queue's (commit log offset, body) in queue order, read through the ConsumeQueues."""
    out: dict[tuple[str, int], list[tuple[int, bytes]]] = {}
    for topic in sorted(store.topics()):
        for q in range(QUEUES):
            got: list[tuple[int, bytes]] = []
            offset = store.min_offset_in_queue(topic, q)
            while True:
                r = store.get_message(topic, q, offset, 32)
                if r.status is not GetMessageStatus.FOUND:
                    break
                for m in r.messages:
                    d = decode_record(m)
                    got.append((d.commit_log_offset, d.body))
                    m.release()
                offset = r.next_begin_offset
            out[(topic, q)] = got
    return out


def assert_replica(master: MessageStore, slave: MessageStore, keys: tuple[str, ...] = ()) -> None:
    assert slave.max_phy_offset() == master.max_phy_offset()
    assert log_bytes(slave) == log_bytes(master)
    assert queue_contents(slave) == queue_contents(master)
    for key in keys:
        topic, k = key.split("#", 1)
        got = [m.commit_log_offset for m in slave.query_message(topic, k)]
        want = [m.commit_log_offset for m in master.query_message(topic, k)]
        assert got, key
        assert got == want, key
