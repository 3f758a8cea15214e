"""A batch (more than one message) appended through the compiled entry point
(``_speedups.StoreEntry.append`` → ``Appender.append_batch``) must answer and store exactly what
the Python path (``MessageStore._append_general``, the reference) does: the result, the
records, every ConsumeQueue unit and every index entry — across CommitLog roll-overs,
ConsumeQueue files that fill mid-batch, a full IndexFile, staged single appends and pending
queue units before it, a list changed while it is checked and a dispatch that fails. Batches
join the stage: a flush, a restart and a kill with batches staged are checked too."""

from __future__ import annotations

import dataclasses
import errno
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest

from data_plane.store import GetMessageStatus, Message, MessageStore, PutMessageStatus, fastpath
from data_plane.store.consume_queue import ConsumeQueue
from data_plane.store.message import decode_record
from tests.conftest import ManualClock, run_store_script, small_config

pytestmark = pytest.mark.skipif(fastpath.speedups_module() is None, reason="the compiled store module is not built")

BORN_HOST = bytes([10, 0, 0, 7, 0, 0, 0x27, 0x10])
TOPICS = ("Orders", "tenant%Pay")
QUEUES = (0, 3)
PREPARED = 0x4  # TRANSACTION_PREPARED_TYPE: a record that takes no ConsumeQueue unit


def _message(rng: random.Random, topic: str, queue_id: int, i: int) -> Message:
    props: dict[str, str] = {}
    if rng.random() < 0.7:
        props["TAGS"] = rng.choice(["TagA", "TagB"])
    if rng.random() < 0.6:
        props["KEYS"] = f"k{rng.randrange(40)} k{rng.randrange(40)}"
    if rng.random() < 0.05:
        props["é"] = "ü"
    body = rng.randbytes(rng.choice([1, 40, 900, 2500]))
    sys_flag = PREPARED if rng.random() < 0.05 else 0
    return Message(
        topic=topic, body=body, queue_id=queue_id, properties=props, born_host=BORN_HOST, flag=i, sys_flag=sys_flag
    )


def _random_append(rng: random.Random, i: int) -> list[Message]:
    topic, queue_id = rng.choice(TOPICS), rng.choice(QUEUES)
    kind = rng.random()
    if kind < 0.35:
        return [_message(rng, topic, queue_id, i)]  # a single append: staged, its unit pended
    msgs = [_message(rng, topic, queue_id, i) for _ in range(rng.choice([2, 3, 8, 32, 40]))]
    if kind < 0.40:
        msgs[-1] = dataclasses.replace(msgs[-1], queue_id=queue_id + 1)  # refused: two queues
    elif kind < 0.43:
        msgs[rng.randrange(len(msgs))] = dataclasses.replace(msgs[0], body=bytes(20_000))  # refused: too big
    elif kind < 0.55:
        msgs[0] = dataclasses.replace(msgs[0], sys_flag=PREPARED)  # led by a prepared transaction
    return msgs


def _copy(msgs: list[Message]) -> list[Message]:
    return [dataclasses.replace(m, properties=dict(m.properties)) for m in msgs]


def _append_result(result: Any) -> tuple[Any, ...] | None:
    a = result.append
    if a is None:
        return None
    return (a.status, a.wrote_offset, a.wrote_bytes, a.store_timestamp, a.queue_offset, a.msg_num, a.msg_ids)


def _queue(store: MessageStore, topic: str, queue_id: int) -> list[tuple[int, int, bytes]]:
    out: list[tuple[int, int, bytes]] = []
    offset = 0
    while True:
        got = store.get_message(topic, queue_id, offset, 64)
        if got.status is not GetMessageStatus.FOUND:
            return out
        for qo, mv in zip(got.queue_offsets, got.messages, strict=True):
            rec = decode_record(mv)
            out.append((qo, rec.commit_log_offset, rec.body))
        offset = got.next_begin_offset


def _log_bytes(store: MessageStore) -> bytes:
    return b"".join(bytes(mf.mv[: mf.wrote_position]) for mf in store.commit_log.mfq.files)


def test_a_batch_is_taken_by_the_compiled_path(make_store: Callable[..., MessageStore]) -> None:
    store = make_store()
    handed_over: list[object] = []
    general = store._append_general

    def spy(msgs: Any) -> Any:
        handed_over.append(msgs)
        return general(msgs)

    store._append_general = spy  # type: ignore[method-assign]  # the entry looks it up on the store
    # A queue's first append makes its ConsumeQueue: the Python path's work.
    first = [Message("T", b"first", 1), Message("T", b"second", 1)]
    assert store.entry.append(first)[0].ok
    assert handed_over == [first]
    handed_over.clear()
    batch = [Message("T", f"m{i}".encode(), 1, properties={"KEYS": f"key{i}"}) for i in range(5)]
    result, end = store.entry.append(batch)
    assert result.status is PutMessageStatus.PUT_OK
    assert handed_over == []
    a = result.append
    assert a is not None
    assert (a.msg_num, a.queue_offset, end) == (5, 2, a.wrote_offset + a.wrote_bytes)
    ids = a.msg_ids.split(",")
    assert len(ids) == 5
    assert ids[0] == a.msg_id
    assert [store.view_message_by_id(i).body for i in ids] == [f"m{i}".encode() for i in range(5)]  # type: ignore[union-attr]
    assert [m.body for m in store.query_message("T", "key3")] == [b"m3"]
    assert store.put_count == 7
    # A tuple is taken too; messages of two queues are handed to the Python path, which refuses them.
    result, _ = store.entry.append((Message("T", b"x", 1), Message("T", b"y", 1)))
    assert result.ok
    assert handed_over == []
    mixed = [Message("T", b"x", 1), Message("T", b"y", 2)]
    result, end = store.entry.append(mixed)
    assert (result.status, end) == (PutMessageStatus.MESSAGE_ILLEGAL, -1)
    assert handed_over == [mixed]
    assert store.put_count == 9
    assert [body for _, _, body in _queue(store, "T", 1)] == [b"first", b"second"] + [
        f"m{i}".encode() for i in range(5)
    ] + [b"x", b"y"]


def test_batches_through_the_entry_store_what_the_reference_path_stores(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    clocks = (ManualClock(), ManualClock())
    stores = [
        MessageStore(
            small_config(
                str(tmp_path / name),
                write_stage_bytes=4096,
                consume_queue_units_per_file=48,  # batches of 32 and 40 spill into the next file
                index_max_entries=512,  # and fill IndexFiles
            ),
            clock_ms=clock,
        )
        for name, clock in (("entry", clocks[0]), ("reference", clocks[1]))
    ]
    for s in stores:
        s.start()
    entry, reference = stores
    batches = 0
    try:
        for i in range(300):
            msgs = _random_append(rng, i)
            copies = _copy(msgs)
            got, got_end = entry.entry.append(msgs)
            if len(copies) == 1:
                want, want_end = MessageStore.append(reference, copies)
            else:
                want, want_end = reference._append_general(copies)
                batches += got.ok
            assert (got.status, got.reason, got_end) == (want.status, want.reason, want_end), (seed, i)
            assert _append_result(got) == _append_result(want), (seed, i)
            step = rng.randrange(3)
            for c in clocks:
                c.advance(step)
        assert batches > 100
        assert (entry.put_count, entry.put_bytes) == (reference.put_count, reference.put_bytes)
        assert len(entry.commit_log.mfq.files) > 3  # the CommitLog rolled over
        for s in stores:
            s.write_staged()
        assert _log_bytes(entry) == _log_bytes(reference)
        for topic in TOPICS:
            for queue_id in (*QUEUES, *(q + 1 for q in QUEUES)):
                assert _queue(entry, topic, queue_id) == _queue(reference, topic, queue_id), (seed, topic, queue_id)
            for k in range(40):
                assert [m.commit_log_offset for m in entry.query_message(topic, f"k{k}", 64)] == [
                    m.commit_log_offset for m in reference.query_message(topic, f"k{k}", 64)
                ], (seed, topic, k)
        assert len(entry.index.files) > 1  # type: ignore[union-attr]
    finally:
        for s in stores:
            s.shutdown()


def test_a_batch_after_staged_singles_and_pending_units_lands_after_them(
    make_store: Callable[..., MessageStore],
) -> None:
    store = make_store(write_stage_bytes=64 * 1024)
    assert store.entry.append([Message("T", b"first", 0)])[0].ok  # (makes the queue: the Python path)
    for i in range(3):
        assert store.entry.append([Message("T", f"single{i}".encode(), 0)])[0].ok
    assert store._appender is not None
    assert store._appender.staged > 0
    cq = store.queues.get("T", 0)
    assert cq is not None
    assert cq.pending_units == 3
    staged = store._appender.staged
    result, _ = store.entry.append([Message("T", f"batch{i}".encode(), 0) for i in range(4)])
    assert result.ok
    assert result.append is not None
    assert store._appender.staged == staged + result.append.wrote_bytes  # the batch joined the stage
    assert cq.pending_units == 0  # the queue's pending units went to its file before the batch's
    assert result.append.queue_offset == 4
    assert [body for _, _, body in _queue(store, "T", 0)] == [
        b"first", b"single0", b"single1", b"single2", b"batch0", b"batch1", b"batch2", b"batch3",
    ]  # fmt: skip
    assert [qo for qo, _, _ in _queue(store, "T", 0)] == list(range(8))


def test_a_list_emptied_while_the_batch_is_appended_is_stored_as_it_was(tmp_path: Path) -> None:
    batch = [Message("T", f"m{i}".encode(), 0) for i in range(3)]

    def clock() -> int:
        batch.clear()  # Python code run mid-append (the store's clock)
        return 1_700_000_000_000

    store = MessageStore(small_config(str(tmp_path / "s")), clock_ms=clock)
    store.start()
    try:
        assert store.entry.append([Message("T", b"first", 0)])[0].ok
        batch[:] = [Message("T", f"m{i}".encode(), 0) for i in range(3)]
        result, _ = store.entry.append(batch)
        assert result.ok
        assert result.append is not None
        assert result.append.msg_num == 3
        assert [body for _, _, body in _queue(store, "T", 0)] == [b"first", b"m0", b"m1", b"m2"]
    finally:
        store.shutdown()


def test_a_flush_and_a_clean_restart_write_staged_batches(make_store: Callable[..., MessageStore]) -> None:
    store = make_store(write_stage_bytes=64 * 1024)
    assert store.entry.append([Message("T", b"first", 0)])[0].ok
    end = 0
    for k in range(4):
        _, end = store.entry.append([Message("T", b"b%d/%d" % (k, i), 0) for i in range(5)])
    assert store._appender is not None
    assert store._appender.staged > 0
    store.commit_log.mfq.flush_all()
    assert store._appender.staged == 0
    assert store.commit_log.mfq.flushed_where == end
    assert store.entry.append([Message("T", b"last", 0), Message("T", b"last2", 0)])[0].ok
    assert store._appender.staged > 0
    path = store.config.store_path
    store.shutdown()
    again = make_store(path)
    assert not again.recovered_abnormally
    want = [b"first"] + [b"b%d/%d" % (k, i) for k in range(4) for i in range(5)] + [b"last", b"last2"]
    assert [body for _, _, body in _queue(again, "T", 0)] == want


KILLED_WITH_BATCHES_STAGED = """
import os, random, sys
sys.path.insert(0, {root!r})
from data_plane.store import Message, MessageStore
from tests.conftest import small_config

rng = random.Random({seed})
store = MessageStore(small_config({path!r}, write_stage_bytes=8192, consume_queue_units_per_file=1000,
                                  index_max_entries=20_000))
store.start()
for q in range(6):  # (each queue's first append makes its ConsumeQueue: the Python path)
    assert store.entry.append([Message(topic="T", body=b"q%d/first" % q, queue_id=q)])[0].ok
    print(q, "first")
i = 0
for _ in range(400):
    q = rng.randrange(6)
    n = rng.choice([2, 5, 16])
    batch = [Message(topic="T", body=b"q%d/%d" % (q, i + k), queue_id=q, properties={{"KEYS": "k%d" % (i + k)}})
             for k in range(n)]
    result, _ = store.entry.append(batch)
    assert result.ok, result
    for k in range(n):
        print(q, i + k)
    i += n
    if rng.random() < 0.02:
        store.commit_log.mfq.flush_all()
        store.flush_indexes(True)
for _ in range(50):  # more until some are staged (a flush or a roll-over leaves none)
    if store._appender.staged:
        break
    batch = [Message(topic="T", body=b"q0/%d" % (i + k), queue_id=0, properties={{"KEYS": "k%d" % (i + k)}})
             for k in range(3)]
    assert store.entry.append(batch)[0].ok
    for k in range(3):
        print(0, i + k)
    i += 3
staged = store._appender.staged
assert staged > 0, staged
print("staged", staged)
sys.stdout.flush()
os._exit(0)  # no shutdown, no write_staged: the staged batches die with the process
"""


def test_batches_staged_when_the_process_dies_are_lost_whole_and_nothing_points_at_them(
    tmp_path: Path, seed: int
) -> None:
    path = str(tmp_path / "store")
    sent: dict[int, list[bytes]] = {}
    keys: dict[bytes, str] = {}
    for line in run_store_script(KILLED_WITH_BATCHES_STAGED, path=path, seed=seed):
        if line.startswith("staged"):
            continue
        q_text, i_text = line.split()
        body = f"q{q_text}/{i_text}".encode()
        sent.setdefault(int(q_text), []).append(body)
        keys[body] = f"k{i_text}"
    store = MessageStore(
        small_config(path, write_stage_bytes=8192, consume_queue_units_per_file=1000, index_max_entries=20_000)
    )
    store.start()
    try:
        assert store.recovered_abnormally
        kept: set[bytes] = set()
        for q, bodies in sent.items():
            got = [body for _, _, body in _queue(store, "T", q)]
            assert got == bodies[: len(got)], (seed, q)  # what is left of each queue: a whole prefix
            assert [qo for qo, _, _ in _queue(store, "T", q)] == list(range(len(got)))
            assert store.max_offset_in_queue("T", q) == len(got), (seed, q)
            kept.update(got)
        assert 0 < len(kept) < len(keys), (seed, len(kept), len(keys))  # the staged tail was lost
        for body, key in keys.items():  # a lost message cannot be found by its key
            if key != "kfirst":
                assert [m.body for m in store.query_message("T", key)] == ([body] if body in kept else []), seed
        end = store.commit_log.max_offset()
        for q in sent:
            cq = store.queues.get("T", q)
            assert cq is not None
            assert cq.max_physic_offset <= end, (seed, q)
    finally:
        store.shutdown()


_TOPIC_SLOT: Any = Message.__dict__["topic"]  # the slot's descriptor
_HOOKS: list[Callable[[], None]] = []  # run (once) by the next read of a _Watched's topic


class _Watched(Message):
    """A store Message whose topic is a property: reading it runs Python code (as a finalizer or
    another thread can while the compiled path checks a batch)."""

    @property
    def topic(self) -> str:
        if _HOOKS:
            _HOOKS.pop()()
        return cast(str, _TOPIC_SLOT.__get__(self))

    @topic.setter
    def topic(self, value: str) -> None:
        _TOPIC_SLOT.__set__(self, value)


@pytest.mark.parametrize("change", ["grow", "shrink"])
def test_a_batch_changed_while_it_is_checked_is_stored_as_it_was_given(
    make_store: Callable[..., MessageStore], change: str
) -> None:
    store = make_store()
    assert store.entry.append([Message("T", b"first", 0)])[0].ok
    batch: list[Message] = [Message("T", b"m0", 0), _Watched("T", b"m1", 0), Message("T", b"m2", 0)]

    def meddle() -> None:
        if change == "grow":
            batch.append(Message("OTHER", b"intruder", 7))  # another queue: never checked if read
        else:
            del batch[1:]

    _HOOKS.append(meddle)
    result, _ = store.entry.append(batch)
    assert _HOOKS == []  # the check ran Python code
    assert result.ok
    assert result.append is not None
    assert result.append.msg_num == 3
    assert store.put_count == 4
    assert [body for _, _, body in _queue(store, "T", 0)] == [b"first", b"m0", b"m1", b"m2"]
    assert store.max_offset_in_queue("OTHER", 7) == 0


def test_a_failed_dispatch_of_a_batch_leaves_the_dispatch_offset_as_the_reference_path_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stores = [
        MessageStore(small_config(str(tmp_path / name), consume_queue_units_per_file=8), clock_ms=ManualClock())
        for name in ("entry", "reference")
    ]
    for s in stores:
        s.start()
    entry, reference = stores
    try:
        for s in stores:
            assert MessageStore.append(s, [Message("T", b"first", 0, properties={"KEYS": "k0"})])[0].ok
        before = [s.dispatcher.dispatched_offset for s in stores]
        counts = [s.index.files[-1].index_count for s in stores]  # type: ignore[union-attr]

        def no_room(*_args: object) -> None:
            raise OSError(errno.ENOSPC, "no room for the ConsumeQueue's next file")

        monkeypatch.setattr(ConsumeQueue, "put_units", no_room)
        batch = [Message("T", b"m%d" % i, 0, properties={"KEYS": f"k{i + 1}"}) for i in range(10)]  # spills
        got, got_end = entry.entry.append(_copy(batch))
        want, want_end = reference._append_general(_copy(batch))
        assert (got.status, got_end) == (want.status, want_end)
        assert entry.dispatch_broken
        assert reference.dispatch_broken
        assert [s.dispatcher.dispatched_offset for s in stores] == before  # the redispatch starts there
        assert [s.index.files[-1].index_count for s in stores] == counts  # type: ignore[union-attr]
    finally:
        for s in stores:
            s.shutdown()
