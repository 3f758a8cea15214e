"""Plain SEND_BATCH_MESSAGE bodies laid out as they are (fastpath.py's "plain batch",
_speedups.c's scan_plain): the records, ConsumeQueue units and index entries are the ones the
batch's store Messages would have made; any body that is not plain is left to that path with
nothing written. Both twins of the write path (the ``write_path`` fixture)."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import pytest

from data_plane.broker.batch_decode import py_batch_messages
from data_plane.broker.send import PLAIN_BATCH_SKIP
from data_plane.remoting.bodies import encode_batch_item
from data_plane.store import MessageStore, fastpath
from data_plane.store.fastpath import py_plain_batch
from data_plane.store.message import (
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_PREPARED_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    encode_properties,
    pack_host,
    tags_hash_code,
)
from data_plane.store.status import PutMessageResult, PutMessageStatus
from tests.unit.named_results import assert_named_alike

BORN_HOST = pack_host("10.1.2.3", 40000)
ASCII = "abcxyzABC019 _-:/.=&"
MAX = 1000
SYS_FLAGS = [0, 0, 1, TRANSACTION_PREPARED_TYPE, TRANSACTION_COMMIT_TYPE, TRANSACTION_ROLLBACK_TYPE]


def _text(rng: random.Random, lo: int, hi: int, chars: str = ASCII) -> str:
    return "".join(rng.choice(chars) for _ in range(rng.randint(lo, hi)))


def _plain_properties(rng: random.Random) -> dict[str, str]:
    props: dict[str, str] = {}
    if rng.random() < 0.7:
        props["TAGS"] = rng.choice(["", "A", "B", "TagA", _text(rng, 1, 12)])
    if rng.random() < 0.5:
        props["KEYS"] = " ".join(_text(rng, 1, 8, "abc019") for _ in range(rng.randint(1, 3)))
    if rng.random() < 0.8:
        props["UNIQ_KEY"] = _text(rng, 32, 32, "0123456789ABCDEF")
    for _ in range(rng.randint(0, 3)):
        props[_text(rng, 1, 10, "abcdefgh_")] = _text(rng, 0, 20)
    items = list(props.items())
    rng.shuffle(items)
    return dict(items)


def _body(items: list[tuple[int, bytes, dict[str, str]]]) -> bytes:
    return b"".join(encode_batch_item(b, flag, encode_properties(p)) for flag, b, p in items)


def _plain_items(rng: random.Random) -> list[tuple[int, bytes, dict[str, str]]]:
    # Mostly up to 20 messages; one batch in five holds 60-150 small ones, past the 64 items the
    # compiled scan keeps on its stack (it scans a larger batch a second time).
    many = rng.random() < 0.2
    count, body_max = (rng.randint(60, 150), 40) if many else (rng.randint(1, 20), 600)
    return [
        (rng.randrange(-(2**31), 2**31), rng.randbytes(rng.randint(1, body_max)), _plain_properties(rng))
        for _ in range(count)
    ]


def _append_plain(
    store: MessageStore, body: bytes, topic: str, queue_id: int, **common: int
) -> tuple[PutMessageResult, int, tuple[int, ...]] | None:
    return store.append_plain_batch(
        body, topic, queue_id, born_host=BORN_HOST, max_messages=MAX, skip_names=PLAIN_BATCH_SKIP, **common
    )


def _log_bytes(store: MessageStore, offset: int, size: int) -> bytes:
    mf = store.commit_log.mfq.find_by_offset(offset)
    assert mf is not None
    at = offset - mf.file_from_offset
    return bytes(mf.mv[at : at + size])


def assert_stored_alike(
    store: MessageStore,
    result: PutMessageResult,
    end: int,
    reference: MessageStore,
    want: PutMessageResult,
    want_end: int,
) -> None:
    """Both stored: at the same offsets, with the same numbers and the same record bytes."""
    assert result.status is want.status is PutMessageStatus.PUT_OK
    a, w = result.append, want.append
    assert a is not None
    assert w is not None
    assert (a.wrote_offset, a.wrote_bytes, a.queue_offset, a.msg_num, a.store_timestamp, a.msg_ids, end) == (
        w.wrote_offset, w.wrote_bytes, w.queue_offset, w.msg_num, w.store_timestamp, w.msg_ids, want_end,
    )  # fmt: skip
    assert _log_bytes(store, a.wrote_offset, a.wrote_bytes) == _log_bytes(reference, w.wrote_offset, w.wrote_bytes)


def test_a_plain_body_is_stored_as_its_messages_would_be(
    make_store: Callable[..., MessageStore], write_path: str, tmp_path: Path, seed: int
) -> None:
    rng = random.Random(seed)
    plain, split = make_store(str(tmp_path / "plain")), make_store(str(tmp_path / "split"))
    queues: set[tuple[str, int]] = set()
    keys: set[str] = set()
    for _ in range(40):
        items = _plain_items(rng)
        body = _body(items)
        topic, queue_id = rng.choice(["Orders", "acme%pay"]), rng.randrange(3)
        queues.add((topic, queue_id))
        common = {
            "sys_flag": rng.choice(SYS_FLAGS),
            "born_timestamp": rng.randrange(2**41),
            "reconsume_times": rng.randrange(3),
        }
        assert fastpath.plain_batch(body, MAX, PLAIN_BATCH_SKIP) == (len(items), sum(len(b) for _, b, _ in items))
        got = _append_plain(plain, body, topic, queue_id, **common)
        assert got is not None
        result, end, tag_codes = got
        msgs = py_batch_messages(
            body, topic, queue_id, common["sys_flag"], common["born_timestamp"], BORN_HOST, common["reconsume_times"]
        )
        assert_stored_alike(plain, result, end, split, *split.append(msgs))
        tags = [p.get("TAGS") for _, _, p in items]
        assert tag_codes == tuple(dict.fromkeys(tags_hash_code(t) if t else 0 for t in tags))
        keys.update(p["UNIQ_KEY"] for _, _, p in items if "UNIQ_KEY" in p)
        keys.update(k for _, _, p in items for k in p.get("KEYS", "").split())
    # The same ConsumeQueue units (every tag filter) and index entries.
    for topic, queue_id in queues:
        for codes in (None, {tags_hash_code("A")}, {0}):
            r1 = plain.get_message(topic, queue_id, 0, 10_000, tags_codes=codes)
            r2 = split.get_message(topic, queue_id, 0, 10_000, tags_codes=codes)
            assert (r1.status, r1.next_begin_offset, r1.max_offset) == (r2.status, r2.next_begin_offset, r2.max_offset)
            assert [bytes(m) for m in r1.messages] == [bytes(m) for m in r2.messages]
            for r in (r1, r2):
                for m in r.messages:
                    m.release()
    for key in sorted(keys)[:30]:
        for topic in ("Orders", "acme%pay"):
            found = [(m.queue_offset, m.body) for m in plain.query_message(topic, key, 64)]
            assert found == [(m.queue_offset, m.body) for m in split.query_message(topic, key, 64)]


NOT_PLAIN: dict[str, bytes] = {
    "non-ASCII property": b"TAGS\x01\xc3\xa9\x02",
    "repeated name": b"TAGS\x01A\x02TAGS\x01B\x02",
    "a schedule property": b"DELAY\x013\x02",
    "a timer property": b"TIMER_DELAY_SEC\x015\x02",
    "the broker's re-put marker": b"ORBIT_REPUT_FROM\x0112\x02",
    "a transaction marker": b"TRAN_MSG\x01true\x02",
    "a value holding \\x01": b"k\x01a\x01b\x02",
    "an empty pair": b"k\x01v\x02\x02",
    "the last pair unterminated": b"k\x01v\x02j\x01w",
    "a pair without \\x01": b"kv\x02",
    "an empty name": b"\x01v\x02",
    "33 pairs": b"".join(b"k%d\x01v\x02" % i for i in range(33)),
}


@pytest.mark.parametrize("why", sorted(NOT_PLAIN))
def test_a_body_that_is_not_plain_is_left_to_the_messages_path_with_nothing_written(
    make_store: Callable[..., MessageStore], write_path: str, why: str
) -> None:
    store = make_store()
    good = encode_batch_item(b"first", 0, b"UNIQ_KEY\x01AB\x02")
    body = good + encode_batch_item(b"second", 0, NOT_PLAIN[why])
    assert fastpath.plain_batch(body, MAX, PLAIN_BATCH_SKIP) is None
    assert py_plain_batch(body, MAX, PLAIN_BATCH_SKIP) is None
    before = store.max_phy_offset()
    assert _append_plain(store, body, "Orders", 0, sys_flag=0, born_timestamp=1, reconsume_times=0) is None
    assert store.max_phy_offset() == before
    assert fastpath.plain_batch(good, MAX, PLAIN_BATCH_SKIP) == (1, 5)  # the good item alone is plain


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"\x00\x00\x00\x16",  # shorter than an item head
        encode_batch_item(b"x", 0, b"") + b"\x00",  # trailing bytes
        encode_batch_item(b"x", 0, b"")[:-1],  # cut short
        encode_batch_item(b"x", 0, b"")[:3] + b"\x7f" + encode_batch_item(b"x", 0, b"")[4:],  # total too big
    ],
)
def test_a_malformed_body_is_left_to_the_messages_path(write_path: str, body: bytes) -> None:
    assert fastpath.plain_batch(body, MAX, PLAIN_BATCH_SKIP) is None
    assert py_plain_batch(body, MAX, PLAIN_BATCH_SKIP) is None


def test_more_messages_than_allowed_is_not_plain(write_path: str) -> None:
    body = encode_batch_item(b"x", 0, b"") * 5
    assert fastpath.plain_batch(body, 5, ()) == (5, 5)
    assert fastpath.plain_batch(body, 4, ()) is None
    counted = fastpath.plain_batch(encode_batch_item(b"abc", 0, b"") * 2, 5, ())
    assert counted is not None
    assert (counted.msg_count, counted.body_bytes) == (2, 6)


def test_twins_agree_on_random_and_mutated_bodies(speedups: object, seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(400):
        body = bytearray(_body(_plain_items(rng)))
        for _ in range(rng.randint(0, 3)):
            at = rng.randrange(len(body))
            body[at] = rng.choice([0, 1, 2, 0x41, 0x80, 0xC3, rng.randrange(256)])
        want = py_plain_batch(bytes(body), MAX, PLAIN_BATCH_SKIP)
        got = speedups.plain_batch(bytes(body), MAX, PLAIN_BATCH_SKIP)  # type: ignore[attr-defined]
        assert got == want
        if want is not None:
            assert_named_alike(got, want)


@pytest.mark.parametrize(
    ("item", "status", "reason"),
    [
        (encode_batch_item(b"", 0, b"a\x01b\x02"), PutMessageStatus.MESSAGE_ILLEGAL, "message body is empty"),
        (encode_batch_item(b"x", 0, b"k\x01" + b"v" * 2000 + b"\x02"), PutMessageStatus.PROPERTIES_SIZE_EXCEEDED,
         "properties take 2003 bytes"),
        (encode_batch_item(b"x" * 20_000, 0, b""), PutMessageStatus.MESSAGE_ILLEGAL, "more than the 16384 allowed"),
    ],
)  # fmt: skip
def test_a_refused_message_refuses_the_plain_batch_as_the_messages_path_does(
    make_store: Callable[..., MessageStore],
    write_path: str,
    tmp_path: Path,
    item: bytes,
    status: PutMessageStatus,
    reason: str,
) -> None:
    plain = make_store(str(tmp_path / "plain"), max_properties_size_bytes=1024)
    split = make_store(str(tmp_path / "split"), max_properties_size_bytes=1024)
    body = encode_batch_item(b"ok", 0, b"") + item
    got = _append_plain(plain, body, "Orders", 0, sys_flag=0, born_timestamp=1, reconsume_times=0)
    assert got is not None
    result, end, tags = got
    want, want_end = split.append(py_batch_messages(body, "Orders", 0, 0, 1, BORN_HOST, 0))
    assert (result.status, result.reason, end, tags) == (want.status, want.reason, want_end, ())
    assert result.status is status
    assert result.reason.startswith("message 1 of the batch: ")
    assert reason in result.reason
    assert plain.max_phy_offset() == 0
