"""One message stored from its parts (``MessageStore.append_plain``: the broker's single
SEND_MESSAGE_V2 path, the compiled Appender's ``append_plain``): the record, ConsumeQueue unit,
index entries and tag code are the ones the message's store Message would have made; a message
that is not plain, or that anything refuses, is left to that path with nothing written."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from pathlib import Path

import pytest

from data_plane.broker.send import PLAIN_BATCH_SKIP
from data_plane.store import MessageStore, fastpath
from data_plane.store.message import (
    Message,
    decode_properties,
    decode_record,
    encode_properties,
    pack_host,
    tags_hash_code,
)
from data_plane.store.status import PutMessageResult, PutMessageStatus
from tests.unit.test_plain_batch import NOT_PLAIN, _plain_properties, assert_stored_alike

BORN_HOST = pack_host("10.1.2.3", 40000)
TOPICS = ("Orders", "acme%pay")


def _plain(store: MessageStore, m: Message, props: str | bytes) -> tuple[PutMessageResult, int, int | None] | None:
    """``append_plain``: the result, where the record ends and its tag hash code (None: not taken)."""
    r = store.append_plain(
        m.topic, m.queue_id, m.body, props, m.flag, m.sys_flag, m.born_timestamp, m.born_host, m.reconsume_times,
        PLAIN_BATCH_SKIP,
    )  # fmt: skip
    if r is None:
        return None
    assert not isinstance(r, PutMessageResult), r  # stored, not refused
    return store.stored_result(r), r.wrote_offset + r.wrote_bytes, r.tags_code


def _message(rng: random.Random, props: dict[str, str]) -> Message:
    return Message(
        rng.choice(TOPICS), rng.randbytes(rng.randint(1, 900)), rng.randrange(3), rng.randrange(-(2**31), 2**31),
        props, rng.choice([0, 1, 4]), rng.randrange(2**41), BORN_HOST, rng.randrange(3),
    )  # fmt: skip


@pytest.fixture
def stores(make_store: Callable[..., MessageStore], tmp_path: Path) -> tuple[MessageStore, MessageStore]:
    """Two stores (same clock), each with a first message in every topic: the plain path takes
    only topics the log has written before."""
    # Index and queue files that hold the test's messages (their roll-overs go the reference
    # way too); the CommitLog's still rolls over a few times.
    room = {"index_max_entries": 8192, "consume_queue_units_per_file": 1024}
    plain, reference = make_store(str(tmp_path / "plain"), **room), make_store(str(tmp_path / "reference"), **room)
    for store in (plain, reference):
        for topic in TOPICS:
            result, _ = store.append([Message(topic, b"first", 0, properties={"UNIQ_KEY": "00"}, born_host=BORN_HOST)])
            assert result.status is PutMessageStatus.PUT_OK
    return plain, reference


def test_a_plain_message_is_stored_as_its_store_message_would_be(
    stores: tuple[MessageStore, MessageStore], write_path: str, seed: int
) -> None:
    rng = random.Random(seed)
    plain, reference = stores
    keys: set[str] = set()
    taken = 0
    for _ in range(300):
        props = _plain_properties(rng)
        m = _message(rng, props)
        text = encode_properties(props)
        got = _plain(plain, m, text.decode() if rng.random() < 0.5 else text)  # as a header's str, or bytes
        if write_path == "pure-python":
            assert got is None  # the Appender is compiled: the pure-Python store takes the reference path
            continue
        if got is None:  # a queue's first message, a file's last: the broker takes the reference path
            result, end = plain.append([dataclasses.replace(m, properties=dict(props))])
            tag_code = None
        else:
            taken += 1
            result, end, tag_code = got
        assert_stored_alike(plain, result, end, reference, *reference.append([m]))
        tags = props.get("TAGS")
        assert tag_code in (None, tags_hash_code(tags) if tags else 0)
        keys.update(v for k, v in props.items() if k == "UNIQ_KEY")
        keys.update(props.get("KEYS", "").split())
    if write_path == "pure-python":
        return
    assert taken >= 270  # all but a queue's first message and those a file roll-over sends back
    for topic in TOPICS:
        for queue_id in range(3):
            for codes in (None, {tags_hash_code("A")}, {0}):
                r1 = plain.get_message(topic, queue_id, 0, 10_000, tags_codes=codes)
                r2 = reference.get_message(topic, queue_id, 0, 10_000, tags_codes=codes)
                assert (r1.status, r1.next_begin_offset) == (r2.status, r2.next_begin_offset)
                assert [bytes(x) for x in r1.messages] == [bytes(x) for x in r2.messages]
                for r in (r1, r2):
                    for x in r.messages:
                        x.release()
    for key in sorted(keys)[:40]:
        for topic in TOPICS:
            found = [(x.queue_offset, x.body) for x in plain.query_message(topic, key, 64)]
            assert found == [(x.queue_offset, x.body) for x in reference.query_message(topic, key, 64)]


NOT_PLAIN_SINGLE: dict[str, tuple[dict[str, object], str | bytes]] = {
    **{why: ({}, props) for why, props in NOT_PLAIN.items()},
    "a non-ASCII header text": ({}, "TAGS\x01caf\u00e9\x02"),
    "an empty body": ({"body": b""}, b""),
    "a flag past 4 bytes": ({"flag": 2**31}, b""),
    "a sys flag past 4 bytes": ({"sys_flag": -(2**31) - 1}, b""),
    "reconsume times past 4 bytes": ({"reconsume_times": 2**31}, b""),
    "a born timestamp past 8 bytes": ({"born_timestamp": 2**63}, b""),
    "a topic the log has not written": ({"topic": "Fresh"}, b""),
    "properties over the store's limit": ({}, b"k\x01" + b"v" * 40_000 + b"\x02"),
    "a body over the store's limit": ({"body": b"x" * 5_000_000}, b""),
}


@pytest.mark.parametrize("why", sorted(NOT_PLAIN_SINGLE))
def test_a_message_that_is_not_plain_is_left_to_the_reference_path_with_nothing_written(
    stores: tuple[MessageStore, MessageStore], write_path: str, why: str
) -> None:
    plain, _ = stores
    changes, props = NOT_PLAIN_SINGLE[why]
    fields: dict[str, object] = {
        "topic": "Orders", "body": b"hello", "flag": 0, "sys_flag": 0, "born_timestamp": 1, "reconsume_times": 0,
    }  # fmt: skip
    fields.update(changes)
    before = plain.max_phy_offset()
    got = plain.append_plain(
        fields["topic"], 0, fields["body"], props, fields["flag"], fields["sys_flag"], fields["born_timestamp"],  # type: ignore[arg-type]
        BORN_HOST, fields["reconsume_times"], PLAIN_BATCH_SKIP,  # type: ignore[arg-type]
    )  # fmt: skip
    assert got is None
    assert plain.max_phy_offset() == before
    # ... while the same parts, plain, are taken (on the compiled path)
    ok = plain.append_plain("Orders", 0, b"hello", b"TAGS\x01A\x02", 0, 0, 1, BORN_HOST, 0, PLAIN_BATCH_SKIP)
    assert (ok is None) == (write_path == "pure-python")


def test_a_stopped_or_full_store_leaves_the_message_to_the_reference_path(
    stores: tuple[MessageStore, MessageStore], write_path: str
) -> None:
    plain, _ = stores
    before = plain.max_phy_offset()
    plain.disk_full = True
    assert plain.append_plain("Orders", 0, b"x", b"", 0, 0, 1, BORN_HOST, 0, PLAIN_BATCH_SKIP) is None
    result, _ = plain.append([Message("Orders", b"x", 0, born_host=BORN_HOST)])
    assert result.status is PutMessageStatus.DISK_FULL  # the reference path says why
    assert plain.max_phy_offset() == before


def test_the_plain_path_reads_back_as_the_message_sent(
    stores: tuple[MessageStore, MessageStore], write_path: str
) -> None:
    plain, _ = stores
    if write_path == "pure-python":
        pytest.skip("the plain path is the compiled Appender's")
    props = {"TAGS": "TagA", "KEYS": "k1 k2", "UNIQ_KEY": "ABCDEF0123", "color": "blue"}
    got = plain.append_plain(
        "Orders", 0, memoryview(b"the body"), encode_properties(props).decode(), 7, 0, 123, BORN_HOST, 1,
        PLAIN_BATCH_SKIP,
    )  # fmt: skip
    assert got is not None
    assert not isinstance(got, PutMessageResult)
    result, tag_code = plain.stored_result(got), got.tags_code
    a = result.append
    assert a is not None
    assert tag_code == tags_hash_code("TagA")
    r = plain.get_message("Orders", 0, a.queue_offset, 1)
    assert len(r.messages) == 1
    ext = decode_record(r.messages[0])
    r.messages[0].release()
    assert (ext.body, ext.flag, ext.born_timestamp, ext.reconsume_times, ext.queue_offset) == (
        b"the body", 7, 123, 1, a.queue_offset,
    )  # fmt: skip
    assert decode_properties(encode_properties(ext.properties)) == props
    assert [x.body for x in plain.query_message("Orders", "k2", 8)] == [b"the body"]


def test_twins_agree_on_whether_properties_are_plain(speedups: object, seed: int) -> None:
    rng = random.Random(seed)
    for why, props in NOT_PLAIN.items():
        assert not fastpath.py_plain_properties(props, PLAIN_BATCH_SKIP), why
        assert not speedups.plain_properties(props, PLAIN_BATCH_SKIP), why  # type: ignore[attr-defined]
    assert not fastpath.py_plain_properties("TAGS\x01caf\u00e9\x02", PLAIN_BATCH_SKIP)
    assert not speedups.plain_properties("TAGS\x01caf\u00e9\x02", PLAIN_BATCH_SKIP)  # type: ignore[attr-defined]
    plain = 0
    for _ in range(2000):
        raw = bytearray(encode_properties(_plain_properties(rng)))
        for _ in range(rng.randint(0, 2)) if raw else ():
            raw[rng.randrange(len(raw))] = rng.choice([0, 1, 2, 0x41, 0x80, rng.randrange(256)])
        given: bytes | str
        for given in (bytes(raw), bytes(raw).decode("latin-1")):
            want = fastpath.py_plain_properties(given, PLAIN_BATCH_SKIP)
            assert speedups.plain_properties(given, PLAIN_BATCH_SKIP) == want, given  # type: ignore[attr-defined]
            plain += want
    assert plain > 1000  # both kinds were tried
