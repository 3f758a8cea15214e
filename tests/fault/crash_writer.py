"""A SYNC_FLUSH writer for the crash test::

    python tests/fault/crash_writer.py <store_dir> <seed> [preallocate|on-demand]

Opens a MessageStore on ``store_dir`` with SYNC_FLUSH and small files, and puts messages from
several concurrent asyncio tasks until it is killed. Message ``seq`` is fully determined by
``(seed, seq)`` (``make_message``), so the parent regenerates it to compare. After each PUT_OK it
prints, and flushes::

    ACK <msg_id> <topic> <queue_id> <queue_offset> <seq>

and ``FAIL <seq> <status> <reason>`` for any other answer (nothing about such a message is
promised). The parent imports this module for ``make_message`` and ``writer_config``.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import random
import sys

if __name__ == "__main__":  # run as a script: make the repository importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from data_plane.store import FlushDiskType, Message, MessageStore, StoreConfig

TOPICS = ("CrashA", "CrashB", "Crash_C")
QUEUES_PER_TOPIC = 4
WRITERS = 8
COMMIT_LOG_FILE_BYTES = 256 * 1024
ALLOCATION = ("preallocate", "on-demand")  # preallocate_next_file on / off


def writer_config(store_dir: str, *, preallocate: bool) -> StoreConfig:
    """The geometry the writer uses (the parent recovers with the same one)."""
    return StoreConfig(
        store_path=store_dir,
        flush_disk_type=FlushDiskType.SYNC_FLUSH,
        commit_log_file_size_bytes=COMMIT_LOG_FILE_BYTES,
        max_message_size_bytes=64 * 1024,
        consume_queue_units_per_file=64,
        index_hash_slots=64,
        index_max_entries=256,
        flush_interval_consume_queue_ms=20,  # checkpoints are written while the writer runs
        # Both ways a CommitLog file comes to be: made ahead by the allocator, or on the write path.
        preallocate_next_file=preallocate,
    )


def message_keys(seed: int, seq: int) -> tuple[str, str]:
    """(its own key in KEYS, its UNIQ_KEY)."""
    return f"k{seed:x}-{seq}", f"U{seed:08X}{seq:016X}"


def make_message(seed: int, seq: int) -> Message:
    """Message number ``seq`` of the writer run with ``seed``."""
    rng = random.Random(f"{seed}/{seq}")
    topic = TOPICS[rng.randrange(len(TOPICS))]
    queue_id = rng.randrange(QUEUES_PER_TOPIC)
    roll = rng.random()
    if roll < 0.05:
        size = rng.randint(8 * 1024, 40 * 1024)  # a few large ones: rollovers at odd places
    elif roll < 0.10:
        size = rng.randint(1, 8)  # an empty body is refused (MESSAGE_ILLEGAL)
    else:
        size = rng.randint(16, 2048)
    key, uniq = message_keys(seed, seq)
    return Message(
        topic=topic,
        body=rng.randbytes(size),
        queue_id=queue_id,
        properties={"KEYS": f"{key} group{seq % 7}", "UNIQ_KEY": uniq, "TAGS": f"tag{seq % 3}"},
        born_timestamp=1_700_000_000_000 + seq,
    )


async def _run(store: MessageStore, seed: int) -> None:
    counter = itertools.count()
    out = sys.stdout

    async def writer() -> None:
        while True:
            seq = next(counter)
            msg = make_message(seed, seq)
            result = await store.put_message(msg)
            if result.ok:
                assert result.append is not None
                a = result.append
                out.write(f"ACK {a.msg_id} {msg.topic} {msg.queue_id} {a.queue_offset} {seq}\n")
            else:
                out.write(f"FAIL {seq} {result.status.value} {result.reason!r}\n")
            out.flush()

    await asyncio.gather(*(writer() for _ in range(WRITERS)))


def main(argv: list[str]) -> int:
    if len(argv) not in (3, 4) or (len(argv) == 4 and argv[3] not in ALLOCATION):
        print(f"usage: {argv[0]} <store_dir> <seed> [{'|'.join(ALLOCATION)}]", file=sys.stderr)
        return 2
    store_dir, seed = argv[1], int(argv[2])
    # Without the third argument the seed picks how CommitLog files are created.
    allocation = argv[3] if len(argv) == 4 else ALLOCATION[seed % 2]
    store = MessageStore(writer_config(store_dir, preallocate=allocation == "preallocate"))
    store.start()
    asyncio.run(_run(store, seed))  # runs until killed
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
