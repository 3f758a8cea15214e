"""The compiled appender remembers, per topic and queue id, the queues it has met (their
ConsumeQueue and offsets key) instead of looking them up by (topic, queue id) on every append.
What it remembers must never go stale: whatever path wrote to a queue in between (batches,
the Python path, a restart), every message gets the next queue offset and reads back."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from data_plane.store import GetMessageStatus, Message, MessageStore, fastpath
from data_plane.store.message import decode_record
from data_plane.store.recovery import adopt_queue_state
from tests.conftest import NO_COMPILED_TWINS

# Where the compiled twins are expected and missing, these fail (test_compiled_twins.py says why).
pytestmark = pytest.mark.skipif(NO_COMPILED_TWINS, reason="the compiled twins are off or cannot be built here")


def _msg(topic: str, queue_id: int, i: int) -> Message:
    return Message(topic=topic, body=b"%s/%d/%d" % (topic.encode(), queue_id, i), queue_id=queue_id)


def _assert_queue_holds(store: MessageStore, topic: str, queue_id: int, bodies: list[bytes]) -> None:
    assert store.max_offset_in_queue(topic, queue_id) == len(bodies)
    offsets: list[int] = []
    read: list[bytes] = []
    while len(read) < len(bodies):
        got = store.get_message(topic, queue_id, len(read), 32)
        assert got.status is GetMessageStatus.FOUND, (topic, queue_id, len(read), got.status)
        offsets += got.queue_offsets
        read += [decode_record(m).body for m in got.messages]
    assert offsets == list(range(len(bodies)))
    assert read == bodies


def test_singles_batches_and_the_python_path_interleaved_keep_every_queue_consecutive(
    make_store: Callable[..., MessageStore],
) -> None:
    seed = random.randrange(1 << 30)
    print(f"seed {seed}")
    rng = random.Random(seed)
    store = make_store(consume_queue_units_per_file=64)  # the queues cross files too
    queues = [(t, q) for t in ("A", "tenant%B") for q in (0, 1, 7, 300)]
    sent: dict[tuple[str, int], list[bytes]] = {k: [] for k in queues}
    for _ in range(1500):
        topic, q = rng.choice(queues)
        kind = rng.random()
        n = len(sent[(topic, q)])
        if kind < 0.7:  # a single: the compiled appender
            msgs = [_msg(topic, q, n)]
        elif kind < 0.9:  # a batch: the Python path sets the queue's offset itself
            msgs = [_msg(topic, q, n + k) for k in range(rng.randint(2, 5))]
        else:  # a single the compiled path leaves alone (not plain text properties)
            msgs = [_msg(topic, q, n)]
            msgs[0].properties = {"KEYS": "k", "é": "ü"}
            fastpath.use_compiled(False)
        try:
            result, _ = store.append(msgs)
        finally:
            fastpath.use_compiled(True)
        assert result.ok, (seed, result)
        sent[(topic, q)].extend(m.body for m in msgs)
    for (topic, q), bodies in sent.items():
        _assert_queue_holds(store, topic, q, bodies)


def test_queue_ids_past_the_remembered_range_are_looked_up_each_time(
    make_store: Callable[..., MessageStore],
) -> None:
    store = make_store()
    bodies: dict[int, list[bytes]] = {70_000: [], 1 << 30: [], 5: []}
    for i in range(20):
        for q, sent in bodies.items():
            m = _msg("T", q, i)
            result, _ = store.append([m])
            assert result.ok, result
            sent.append(m.body)
    for q, got in bodies.items():
        _assert_queue_holds(store, "T", q, got)


def test_a_queue_offset_set_from_outside_is_the_one_the_next_append_takes(
    make_store: Callable[..., MessageStore],
) -> None:
    store = make_store()
    for i in range(3):
        assert store.append([_msg("T", 2, i)])[0].ok
    # what a slave's promotion does (its records came as raw bytes): the offsets are set again
    adopt_queue_state(store)
    assert store.commit_log.queue_offsets[("T", 2)] == 3
    result, _ = store.append([_msg("T", 2, 3)])
    assert result.ok
    assert result.append is not None
    assert result.append.queue_offset == 3


def test_after_a_restart_the_new_appender_continues_each_queue(make_store: Callable[..., MessageStore]) -> None:
    store = make_store()
    path = store.config.store_path
    bodies = []
    for i in range(10):
        m = _msg("T", 4, i)
        assert store.append([m])[0].ok
        bodies.append(m.body)
    store.shutdown()
    again = make_store(path)
    for i in range(10, 20):
        m = _msg("T", 4, i)
        assert again.append([m])[0].ok
        bodies.append(m.body)
    _assert_queue_holds(again, "T", 4, bodies)
