"""The write path's fast loops: the compiled twin and the pure-Python twin agree byte for byte
(fastpath.py, _speedups.c)."""

from __future__ import annotations

import os
import random
import struct
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest

from data_plane.store import fastpath
from data_plane.store.fastpath import py_index_write
from data_plane.store.index_file import INDEX_ENTRY_SIZE, index_file_size, key_hash
from data_plane.store.layouts import CQ_UNIT, INDEX_ITEM
from data_plane.store.message import (
    RECORD_HEADER,
    TRANSACTION_ROLLBACK_TYPE,
    TRANSACTION_TYPE_MASK,
    Message,
    decode_record,
    encode_properties,
    pack_host,
    tags_hash_code,
)
from tests.unit.named_results import assert_named_alike

# Both twins' answers are read the same way here, by index and by name (their classes differ).
py_write_batch: Callable[..., Any] = fastpath.py_write_batch

STORE_HOST = pack_host("10.0.0.7", 10911)
STORE_TS = 1_700_000_123_456
MAX_PROPS = 32767
MAX_MSG = 4 * 1024 * 1024
TOPIC_CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-%|"
TEXT_CHARS = "abcxyz019 _-:/.\u00e9\u00df\u4e2d\u6587\U0001f600\U00010348"

WriteBatch = Callable[..., tuple[Any, ...]]


def _text(rng: random.Random, lo: int, hi: int, chars: str = TEXT_CHARS) -> str:
    return "".join(rng.choice(chars) for _ in range(rng.randint(lo, hi)))


def _random_properties(rng: random.Random) -> dict[str, str]:
    items: list[tuple[str, str]] = []
    if rng.random() < 0.7:
        items.append(("TAGS", _text(rng, 0, 12)))
    if rng.random() < 0.7:
        keys = [_text(rng, 1, 10, TEXT_CHARS.replace(" ", "")) for _ in range(rng.randint(0, 5))]
        sep = [rng.choice([" ", "  ", " "]) for _ in keys]
        value = "".join(k + s for k, s in zip(keys, sep, strict=True))
        if rng.random() < 0.3:
            value = " " + value
        items.append(("KEYS", value if rng.random() < 0.5 else value.rstrip(" ")))
    if rng.random() < 0.7:
        items.append(("UNIQ_KEY", _text(rng, 0, 32, "0123456789ABCDEF")))
    for _ in range(rng.randint(0, 4)):
        items.append((_text(rng, 1, 12, TEXT_CHARS.replace(" ", "")), _text(rng, 0, 40)))
    rng.shuffle(items)  # the order of the well-known properties must not matter
    return dict(items)


def _random_message(rng: random.Random, topic: str, queue_id: int) -> Message:
    body_len = rng.choice([1, 2, rng.randint(1, 100), rng.randint(1, 5000), 5000])
    return Message(
        topic=topic,
        body=rng.randbytes(body_len),
        queue_id=queue_id,
        flag=rng.randint(-(2**31), 2**31 - 1),
        properties=_random_properties(rng),
        sys_flag=rng.choice([0, 4, 8, 12]) | rng.choice([0, 0, 1, 2, 3]),
        born_timestamp=rng.choice([0, rng.randint(0, 2**62), 1_700_000_000_000 + rng.randint(0, 10**9)]),
        born_host=rng.randbytes(8),
        reconsume_times=rng.randint(0, 16),
        prepared_transaction_offset=rng.randint(0, 2**40),
    )


def _batch(rng: random.Random) -> tuple[list[Message], bytes, int]:
    topic = _text(rng, 1, rng.choice([8, 127]), TOPIC_CHARS)
    queue_id = rng.randint(0, 2**31 - 1)
    return [_random_message(rng, topic, queue_id) for _ in range(rng.randint(1, 12))], topic.encode(), queue_id


def _record_size(m: Message, topic_b: bytes) -> int:
    return RECORD_HEADER.size + len(m.body) + 1 + len(topic_b) + 2 + len(encode_properties(m.properties))


def _index_buffer(rng: random.Random, slots: int, max_entries: int, begin_ts: int) -> tuple[bytearray, int]:
    """An IndexFile mapping already holding some entries; returns it and its entry count."""
    buf = bytearray(index_file_size(slots, max_entries))
    count = 1
    n = rng.randint(1, max(1, max_entries // 3))
    items = b"".join(INDEX_ITEM.pack(rng.randrange(2**31), rng.randrange(2**40)) for _ in range(n))
    count = py_index_write(memoryview(buf), slots, count, max_entries, begin_ts, begin_ts + 5000, items, 0).index_count
    return buf, count


def _assert_twins_agree(
    compiled: WriteBatch, head: tuple[Any, ...], buf_size: int, targets: tuple[Any, ...] = ()
) -> tuple[tuple[Any, ...], bytearray, list[bytearray]]:
    """Run both twins on identical copies; assert they agree; return the Python one's output."""
    outs = []
    for fn in (compiled, py_write_batch):
        buf = bytearray(buf_size)
        tgt_copies = [bytearray(t) if isinstance(t, bytearray) else t for t in targets]
        args = [memoryview(t) if isinstance(t, bytearray) else t for t in tgt_copies]
        result = fn(memoryview(buf), *head, *args)
        outs.append((result, buf, [t for t in tgt_copies if isinstance(t, bytearray)]))
    (c_res, c_buf, c_tgts), (p_res, p_buf, p_tgts) = outs
    if c_res[0] == 2:  # refusals: the same message, the same status
        assert c_res[:3] == p_res[:3]
    else:
        assert c_res == p_res
        assert_named_alike(c_res, p_res)
    assert c_buf == p_buf
    assert c_tgts == p_tgts
    return p_res, p_buf, p_tgts


# --- the two twins agree ---------------------------------------------------------------------
def test_both_twins_write_identical_records_units_and_index_items_for_random_batches(
    speedups: ModuleType, seed: int
) -> None:
    rng = random.Random(seed)
    for _ in range(150):
        msgs, topic_b, queue_id = _batch(rng)
        need = sum(_record_size(m, topic_b) for m in msgs)
        pos = rng.choice([0, rng.randint(0, 5000)])
        file_from = rng.choice([0, rng.randint(0, 2**40)])
        first_qo = rng.choice([0, rng.randint(0, 2**40)])
        index_enabled = rng.random() < 0.8
        head = (
            pos,
            pos + need + rng.randint(0, 100),
            file_from,
            msgs,
            topic_b,
            queue_id,
            first_qo,
            STORE_TS,
            STORE_HOST,
            MAX_PROPS,
            MAX_MSG,
            index_enabled,
        )
        result, _, _ = _assert_twins_agree(speedups.write_batch, head, pos + need + 200)
        assert result[0] == 0
        assert result[1] == pos + need


def test_both_twins_write_units_and_index_entries_straight_into_their_targets(speedups: ModuleType, seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(100):
        msgs, topic_b, queue_id = _batch(rng)
        need = sum(_record_size(m, topic_b) for m in msgs)
        slots = rng.choice([1, 7, 64])
        max_entries = rng.choice([64, 256])
        begin_ts = STORE_TS - rng.choice([0, 999, 1000, 3_600_000, -5000])
        ix, count = _index_buffer(rng, slots, max_entries, begin_ts)
        cq = bytearray(rng.randbytes(20 * 40))
        cq_pos = rng.choice([0, 20 * rng.randint(0, 30)])
        cq_limit = rng.choice([len(cq), cq_pos + 20 * rng.randint(0, 12)])
        head = (0, need, 4096, msgs, topic_b, queue_id, 17, STORE_TS, STORE_HOST, MAX_PROPS, MAX_MSG, True)
        targets = (cq, cq_pos, cq_limit, ix, slots, count, max_entries, begin_ts)
        _assert_twins_agree(speedups.write_batch, head, need, targets)


def test_both_twins_add_identical_index_entries(speedups: ModuleType, seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(200):
        slots = rng.choice([1, 3, 64, 1000])
        max_entries = rng.choice([2, 10, 300])
        begin_ts = 1_700_000_000_000
        store_ts = begin_ts + rng.choice([0, 999, 1000, rng.randint(0, 10**9), -1, -(10**6), (2**31 + 5) * 1000])
        ix, count = _index_buffer(rng, slots, max_entries, begin_ts)
        n = rng.randint(0, 50)
        # Key hashes are CRC-32C masked to 31 bits.
        items = b"".join(INDEX_ITEM.pack(rng.randrange(2**31), rng.randrange(2**63)) for _ in range(n))
        start = rng.randint(0, n)
        outs = []
        for fn in (speedups.index_write, py_index_write):
            buf = bytearray(ix)
            outs.append((fn(memoryview(buf), slots, count, max_entries, begin_ts, store_ts, items, start), buf))
        assert outs[0] == outs[1]
        assert_named_alike(outs[0][0], outs[1][0])


@pytest.mark.parametrize(
    "properties",
    [
        {"UNIQ_KEY": "U1", "KEYS": "a b"},
        {"KEYS": "a b", "UNIQ_KEY": "U1"},
        {"KEYS": "a b", "TAGS": "t", "UNIQ_KEY": "U1"},
    ],
    ids=["uniq-first", "keys-first", "keys-tags-uniq"],
)
def test_both_twins_index_the_uniq_key_then_the_keys_whatever_the_order_of_the_properties(
    speedups: ModuleType, properties: dict[str, str]
) -> None:
    msg = Message(topic="T", body=b"x", properties=properties)
    expect = b"".join(INDEX_ITEM.pack(key_hash(f"T#{k}"), 0) for k in ("U1", "a", "b"))
    for fn in (speedups.write_batch, py_write_batch):
        r = fn(memoryview(bytearray(500)), 0, 500, 0, [msg], b"T", 0, 0, STORE_TS, STORE_HOST, MAX_PROPS, MAX_MSG, True)
        assert r[5] == expect, fn


# --- refusals --------------------------------------------------------------------------------
def _refusal_cases() -> list[tuple[str, dict[str, Any], str]]:
    return [
        ("empty body", {"body": b""}, "MESSAGE_ILLEGAL"),
        ("\\x01 in a value", {"properties": {"a": "x\x01y"}}, "MESSAGE_ILLEGAL"),
        ("\\x02 in a value", {"properties": {"a": "x\x02"}}, "MESSAGE_ILLEGAL"),
        ("\\x01 in a name", {"properties": {"a\x01": "v"}}, "MESSAGE_ILLEGAL"),
        ("\\x02 in a name", {"properties": {"\x02": "v"}}, "MESSAGE_ILLEGAL"),
        ("empty name", {"properties": {"": "v"}}, "MESSAGE_ILLEGAL"),
        ("non-str value", {"properties": {"a": 5}}, "MESSAGE_ILLEGAL"),
        ("bytes value", {"properties": {"a": b"v"}}, "MESSAGE_ILLEGAL"),
        ("non-str name", {"properties": {7: "v"}}, "MESSAGE_ILLEGAL"),
        ("lone surrogate", {"properties": {"a": "\ud800"}}, "MESSAGE_ILLEGAL"),
        ("properties too large", {"properties": {"big": "x" * 1000}}, "PROPERTIES_SIZE_EXCEEDED"),
        ("record over max size", {"body": b"b" * 5000}, "MESSAGE_ILLEGAL"),
        ("flag out of range", {"flag": 2**31}, "MESSAGE_ILLEGAL"),
        ("born host not 8 bytes", {"born_host": b"\x7f\x00\x00\x01"}, "MESSAGE_ILLEGAL"),
    ]


@pytest.mark.parametrize(("case", "change", "status"), _refusal_cases(), ids=[c[0] for c in _refusal_cases()])
@pytest.mark.parametrize("bad_index", [0, 2])
def test_both_twins_refuse_the_same_bad_message_with_the_same_status_and_write_nothing(
    speedups: ModuleType, case: str, change: dict[str, Any], status: str, bad_index: int
) -> None:
    msgs = [Message(topic="T", body=b"ok" * 10, properties={"KEYS": "a b", "UNIQ_KEY": "U"}) for _ in range(4)]
    for name, value in change.items():
        setattr(msgs[bad_index], name, value)
    head = (0, 1 << 16, 0, msgs, b"T", 0, 0, STORE_TS, STORE_HOST, 500, 4000, True)
    cq = bytearray(400)
    ix = bytearray(index_file_size(4, 16))
    targets = (cq, 0, 400, ix, 4, 2, 16, STORE_TS)
    outs = []
    for fn in (speedups.write_batch, py_write_batch):
        buf = bytearray(1 << 16)
        cq_copy, ix_copy = bytearray(cq), bytearray(ix)
        r = fn(memoryview(buf), *head, memoryview(cq_copy), *targets[1:3], memoryview(ix_copy), *targets[4:])
        outs.append(r)
        assert r[0] == 2, (fn, r)
        assert r[1] == bad_index
        assert r[2] == status
        assert isinstance(r[3], str)
        assert r[3]
        assert buf == bytearray(1 << 16), "nothing is written for a refused batch"
        assert cq_copy == cq
        assert ix_copy == ix
    assert outs[0][:3] == outs[1][:3]


def test_a_record_of_exactly_the_max_size_is_accepted(speedups: ModuleType) -> None:
    msg = Message(topic="T", body=b"x" * 100)
    total = _record_size(msg, b"T")
    for fn in (speedups.write_batch, py_write_batch):
        r = fn(memoryview(bytearray(total)), 0, total, 0, [msg], b"T", 0, 0, STORE_TS, STORE_HOST, 0, total, True)
        assert r[0] == 0
        r = fn(memoryview(bytearray(total)), 0, total, 0, [msg], b"T", 0, 0, STORE_TS, STORE_HOST, 0, total - 1, True)
        assert r[:3] == (2, 0, "MESSAGE_ILLEGAL")


def test_properties_of_exactly_the_max_size_are_accepted(speedups: ModuleType) -> None:
    props = {"k": "v" * 10}
    size = len(encode_properties(props))
    msg = Message(topic="T", body=b"x", properties=props)
    for fn in (speedups.write_batch, py_write_batch):
        buf = memoryview(bytearray(1000))
        assert fn(buf, 0, 1000, 0, [msg], b"T", 0, 0, STORE_TS, STORE_HOST, size, MAX_MSG, True)[0] == 0
        r = fn(buf, 0, 1000, 0, [msg], b"T", 0, 0, STORE_TS, STORE_HOST, size - 1, MAX_MSG, True)
        assert r[:3] == (2, 0, "PROPERTIES_SIZE_EXCEEDED")


@pytest.mark.parametrize("short_by", [1, 100])
def test_a_batch_that_does_not_fit_before_the_limit_returns_the_bytes_needed_and_writes_nothing(
    speedups: ModuleType, seed: int, short_by: int
) -> None:
    rng = random.Random(seed)
    msgs, topic_b, queue_id = _batch(rng)
    need = sum(_record_size(m, topic_b) for m in msgs)
    pos = 300
    for fn in (speedups.write_batch, py_write_batch):
        buf = bytearray(b"\xaa" * (pos + need + 10))
        before = bytes(buf)
        r = fn(
            memoryview(buf),
            pos,
            pos + need - short_by,
            0,
            msgs,
            topic_b,
            queue_id,
            0,
            STORE_TS,
            STORE_HOST,
            MAX_PROPS,
            MAX_MSG,
            True,
        )
        assert r == (1, need)
        assert bytes(buf) == before
        assert (
            fn(
                memoryview(buf),
                pos,
                pos + need,
                0,
                msgs,
                topic_b,
                queue_id,
                0,
                STORE_TS,
                STORE_HOST,
                MAX_PROPS,
                MAX_MSG,
                True,
            )[0]
            == 0
        )


# --- what the output means (checked on both twins) -------------------------------------------
def test_write_batch_lays_out_records_units_and_index_items_that_mean_what_they_say(write_path: str, seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(40):
        msgs, topic_b, queue_id = _batch(rng)
        need = sum(_record_size(m, topic_b) for m in msgs)
        pos, file_from, first_qo = rng.randint(0, 100), rng.randint(0, 2**40), rng.randint(0, 1000)
        buf = bytearray(pos + need)
        r = fastpath.write_batch(
            memoryview(buf),
            pos,
            pos + need,
            file_from,
            msgs,
            topic_b,
            queue_id,
            first_qo,
            STORE_TS,
            STORE_HOST,
            MAX_PROPS,
            MAX_MSG,
            True,
        )
        status, end, next_qo, batch_first_qo, cq, idx, last_ix, count, tag_codes = r
        assert (status, end, last_ix, count, tag_codes) == (0, pos + need, -1, len(msgs), None)
        expect_cq = b""
        expect_idx = b""
        qo = first_qo
        first_seen: int | None = None
        p = pos
        topic = topic_b.decode()
        for m in msgs:
            got = decode_record(memoryview(buf), p)
            tran = m.sys_flag & TRANSACTION_TYPE_MASK
            advances = tran in (0, 8)
            my_qo = qo if advances else 0
            if first_seen is None:
                first_seen = my_qo
            assert got.topic == topic
            assert got.queue_id == queue_id
            assert got.queue_offset == my_qo
            assert got.commit_log_offset == file_from + p
            assert got.body == m.body
            assert got.properties == m.properties
            assert got.flag == m.flag
            assert got.sys_flag == m.sys_flag
            assert got.born_timestamp == m.born_timestamp
            assert got.store_timestamp == STORE_TS
            assert got.reconsume_times == m.reconsume_times
            assert got.prepared_transaction_offset == m.prepared_transaction_offset
            assert buf[p + 48 : p + 56] == m.born_host
            assert buf[p + 64 : p + 72] == STORE_HOST
            tags = m.properties.get("TAGS")
            if advances:
                expect_cq += CQ_UNIT.pack(file_from + p, got.total_size, tags_hash_code(tags) if tags else 0)
                qo += 1
            if tran != TRANSACTION_ROLLBACK_TYPE:
                keys = [m.properties["UNIQ_KEY"]] if m.properties.get("UNIQ_KEY") else []
                keys += [k for k in m.properties.get("KEYS", "").split(" ") if k]
                for k in keys:
                    expect_idx += INDEX_ITEM.pack(key_hash(f"{topic}#{k}"), file_from + p)
            p += got.total_size
        assert p == end
        assert next_qo == qo
        assert batch_first_qo == first_seen
        assert cq == expect_cq
        assert idx == expect_idx


def test_write_batch_indexes_nothing_when_the_index_is_disabled(write_path: str) -> None:
    msg = Message(topic="T", body=b"x", properties={"KEYS": "a b", "UNIQ_KEY": "U"})
    r = fastpath.write_batch(
        memoryview(bytearray(500)), 0, 500, 0, [msg], b"T", 0, 0, STORE_TS, STORE_HOST, MAX_PROPS, MAX_MSG, False
    )
    assert r[0] == 0
    assert r[5] == b""
    assert len(r[4]) == 20


def test_direct_writes_equal_the_bytes_the_caller_would_have_written(write_path: str, seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(30):
        msgs, topic_b, queue_id = _batch(rng)
        for m in msgs:
            m.sys_flag &= ~TRANSACTION_TYPE_MASK  # every message takes a unit and is indexed
            m.properties["UNIQ_KEY"] = "U" + str(rng.randrange(10**6))
        need = sum(_record_size(m, topic_b) for m in msgs)
        slots, max_entries, begin_ts = rng.choice([1, 13]), 512, STORE_TS - 7_000
        ix, count = _index_buffer(rng, slots, max_entries, begin_ts)
        head = (0, need, 0, msgs, topic_b, queue_id, 0, STORE_TS, STORE_HOST, MAX_PROPS, MAX_MSG, True)
        plain = fastpath.write_batch(memoryview(bytearray(need)), *head)
        cq_units, items = plain[4], plain[5]
        cq = bytearray(20 * 50)
        cq_pos = 20 * rng.randint(0, 30)
        ix_direct = bytearray(ix)
        direct = fastpath.write_batch(
            memoryview(bytearray(need)),
            *head,
            memoryview(cq),
            cq_pos,
            len(cq),
            memoryview(ix_direct),
            slots,
            count,
            max_entries,
            begin_ts,
        )
        assert direct[:4] == plain[:4]
        assert direct[4] == cq_pos + len(cq_units)
        assert cq[cq_pos : cq_pos + len(cq_units)] == cq_units
        assert bytes(cq[:cq_pos]) == bytes(cq_pos)
        ix_by_caller = bytearray(ix)
        new_count, used, last = py_index_write(
            memoryview(ix_by_caller), slots, count, max_entries, begin_ts, STORE_TS, items, 0
        )
        assert used == len(items) // 12
        assert direct[5] == new_count == count + len(items) // 12
        assert direct[6] == last == struct.unpack_from(">q", items, len(items) - 8)[0]
        assert ix_direct == ix_by_caller


def test_direct_writes_are_skipped_when_the_targets_cannot_take_everything(write_path: str) -> None:
    msgs = [Message(topic="T", body=b"x", properties={"KEYS": "a b c"}) for _ in range(3)]
    need = sum(_record_size(m, b"T") for m in msgs)
    head = (0, need, 0, msgs, b"T", 0, 0, STORE_TS, STORE_HOST, MAX_PROPS, MAX_MSG, True)
    cq = bytearray(100)
    ix = bytearray(index_file_size(4, 10))
    # CQ room for 2 units of 3; index room for 8 entries of 9; an IndexFile not yet begun.
    for cq_limit, ix_count, ix_max in [(40, 2, 10), (60, 2, 10), (60, 1, 100)]:
        r = fastpath.write_batch(
            memoryview(bytearray(need)),
            *head,
            memoryview(cq),
            0,
            cq_limit,
            memoryview(ix),
            4,
            ix_count,
            ix_max,
            STORE_TS,
        )
        assert r[0] == 0
        if cq_limit == 40:
            assert isinstance(r[4], bytes)
            assert len(r[4]) == 60
        else:
            assert r[4] == 60
        assert isinstance(r[5], bytes)
        assert len(r[5]) == 9 * 12
        assert r[6] == -1
        assert ix == bytearray(index_file_size(4, 10))
    assert bytes(cq[60:]) == bytes(40)


def test_index_write_stops_when_the_file_is_full_and_says_where(write_path: str) -> None:
    buf = bytearray(index_file_size(4, 5))
    items = b"".join(INDEX_ITEM.pack(i, 1000 + i) for i in range(10))
    count, nxt, last = fastpath.index_write(memoryview(buf), 4, 1, 5, STORE_TS, STORE_TS, items, 0)
    assert (count, nxt, last) == (5, 4, 1003)
    again = fastpath.index_write(memoryview(buf), 4, 5, 5, STORE_TS, STORE_TS, items, nxt)
    assert (again.index_count, again.next_item, again.last_indexed) == (5, 4, -1)  # nothing added: full
    entries_at = 40 + 4 * 4
    assert bytes(buf[entries_at : entries_at + INDEX_ENTRY_SIZE]) == bytes(INDEX_ENTRY_SIZE)  # entry 0 unused
    assert struct.unpack_from(">iqii", buf, entries_at + 4 * INDEX_ENTRY_SIZE) == (3, 1003, 0, 0)


# --- staging buffer and file descriptor ------------------------------------------------------
def test_both_twins_write_the_staged_records_to_the_file_at_the_given_offset(
    speedups: ModuleType, seed: int, tmp_path: Any
) -> None:
    rng = random.Random(seed)
    for twin in (speedups.write_batch, py_write_batch):
        for round_ in range(20):
            msgs, topic_b, queue_id = _batch(rng)
            need = sum(_record_size(m, topic_b) for m in msgs)
            at = rng.choice([0, rng.randint(1, 10_000)])
            path = tmp_path / f"log-{twin is py_write_batch}-{round_}"
            path.write_bytes(b"\xee" * (at + need + 64))
            stage = bytearray(need + 8)
            fd = os.open(path, os.O_RDWR)
            try:
                head = (0, need, 4096 + at, msgs, topic_b, queue_id, 0, STORE_TS, STORE_HOST, MAX_PROPS, MAX_MSG, True)
                result = twin(memoryview(stage), *head, None, 0, 0, None, 0, 0, 0, 0, fd, at)
            finally:
                os.close(fd)
            assert result[0] == 0
            assert result[1] == need
            data = path.read_bytes()
            assert data[at : at + need] == stage[:need], "the file holds exactly the staged records"
            assert data[:at] == b"\xee" * at, "nothing before was touched"
            assert data[at + need :] == b"\xee" * 64, "nothing after was touched"
            first = decode_record(data, at)
            assert first.commit_log_offset == 4096 + at
            assert first.body == msgs[0].body


def test_a_file_that_refuses_the_records_raises_and_leaves_the_index_targets_alone(
    speedups: ModuleType, tmp_path: Any
) -> None:
    msgs = [Message(topic="T", body=b"x" * 100, properties={"UNIQ_KEY": "ABC", "TAGS": "t"})]
    need = _record_size(msgs[0], b"T")
    path = tmp_path / "log"
    path.write_bytes(bytes(need))
    for twin in (speedups.write_batch, py_write_batch):
        cq = bytearray(200)
        ix, count = _index_buffer(random.Random(1), 7, 64, STORE_TS)
        ix_before = bytes(ix)
        fd = os.open(path, os.O_RDONLY)  # pwrite fails with EBADF
        try:
            with pytest.raises(OSError, match="Bad file descriptor"):
                twin(
                    memoryview(bytearray(need)),
                    0,
                    need,
                    0,
                    msgs,
                    b"T",
                    0,
                    0,
                    STORE_TS,
                    STORE_HOST,
                    MAX_PROPS,
                    MAX_MSG,
                    True,
                    memoryview(cq),
                    0,
                    len(cq),
                    memoryview(ix),
                    7,
                    count,
                    64,
                    STORE_TS,
                    fd,
                    0,
                )
        finally:
            os.close(fd)
        assert cq == bytearray(200), "no ConsumeQueue unit names a record that is not in the file"
        assert bytes(ix) == ix_before, "no index entry names it either"


def _random_units(rng: random.Random, cur_from: int, cur_len: int, n: int) -> bytes:
    """ConsumeQueue units, most inside the file [cur_from, cur_from + cur_len), some removed,
    some in other files, some cut short by the file's end, some of size 0."""
    out = []
    for _ in range(n):
        size = rng.choice([rng.randint(1, 300), rng.randint(1, 40), 0, -5])
        kind = rng.random()
        if kind < 0.6:
            phy = cur_from + rng.randint(0, max(0, cur_len - max(size, 1)))
        elif kind < 0.7:
            phy = cur_from + cur_len - max(size, 1)  # ends exactly at the file's end
        elif kind < 0.8:
            phy = cur_from + cur_len - rng.randint(0, 20)  # at or past the end: cut short
        elif kind < 0.9:
            phy = rng.choice([cur_from - rng.randint(1, 5000), cur_from + cur_len + rng.randint(0, 5000)])
        else:
            phy = rng.randint(0, 3)  # below the log's min offset
        out.append(CQ_UNIT.pack(phy, size, rng.choice([0, 7, 42, tags_hash_code("a"), -(2**40)])))
    return b"".join(out)


def test_both_twins_collect_the_same_records_from_consume_queue_units(speedups: ModuleType, seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(300):
        cur_from = rng.choice([0, 4096, 10**12])
        mapping = memoryview(rng.randbytes(rng.choice([0, 64, 2000])))
        n = rng.randint(0, 40)
        units = memoryview(_random_units(rng, cur_from, len(mapping), n))
        args = (
            units,
            rng.randint(0, n),
            n,
            rng.choice([mapping, None]),
            cur_from,
            cur_from + len(mapping),
            rng.choice([0, 4, cur_from]),
            rng.choice([1, 3, 32]),
            rng.choice([50, 500, 256 * 1024]),
            rng.choice([0, 100]),
            rng.choice([None, {7, 42}, frozenset({tags_hash_code("a")}), [0]]),
        )
        first_queue_offset = rng.randint(0, 10**9)
        already = rng.choice([0, 0, 1])  # messages an earlier call took
        coalesce = rng.choice([False, True])
        outs = []
        for fn in (speedups.collect_units, fastpath.py_collect_units):
            messages: list[memoryview] = [memoryview(b"old")] * already
            offsets: list[int] = [5] * len(messages)
            got = fn(*args, messages, offsets, first_queue_offset, coalesce)
            outs.append((got, [bytes(m) for m in messages], offsets))
        assert outs[0] == outs[1], f"seed {seed}"
        assert_named_alike(outs[0][0], outs[1][0])


def test_collect_units_takes_whole_records_in_queue_order_and_stops_where_it_must() -> None:
    mapping = memoryview(bytes(range(256)) * 4)  # the file [1000, 2024)
    units = b"".join(
        CQ_UNIT.pack(phy, size, tag)
        for phy, size, tag in [(1000, 10, 1), (1010, 20, 2), (1030, 5, 1), (5000, 10, 1), (1040, 5, 1)]
    )
    for fn in _collect_twins():
        messages: list[memoryview] = []
        offsets: list[int] = []
        # Stops at the unit in another file (index 3), not taking it.
        assert fn(units, 0, 5, mapping, 1000, 2024, 0, 32, 1 << 20, 0, None, messages, offsets, 100) == (3, 35, 1030, 0)
        assert [bytes(m) for m in messages] == [bytes(mapping[0:10]), bytes(mapping[10:30]), bytes(mapping[30:35])]
        assert offsets == [100, 101, 102]
        # Full at two messages: the third is left for the next pull.
        messages, offsets = [], []
        got = fn(units, 0, 5, mapping, 1000, 2024, 0, 2, 1 << 20, 0, None, messages, offsets, 0)
        assert (got.next_unit, got.total_bytes, got.last_phy_offset, got.full) == (2, 30, 1010, 1)
        # The tag filter skips units without stopping.
        messages, offsets = [], []
        assert fn(units, 0, 3, mapping, 1000, 2024, 0, 32, 1 << 20, 0, {1}, messages, offsets, 0) == (3, 15, 1030, 0)
        assert offsets == [0, 2]
        # Over the byte limit stops, but the first message always goes, however large.
        messages, offsets = [], []
        assert fn(units, 0, 3, mapping, 1000, 2024, 0, 32, 12, 0, None, messages, offsets, 0) == (1, 10, 1000, 1)
        messages, offsets = [], []
        assert fn(units, 1, 3, mapping, 1000, 2024, 0, 32, 12, 0, None, messages, offsets, 0) == (2, 20, 1010, 1)
        # Without a file yet, nothing is taken: the caller finds the file first.
        assert fn(units, 0, 3, None, 1000, 2024, 0, 32, 1 << 20, 0, None, [], [], 0) == (0, 0, 0, 0)


def test_collect_units_coalesces_records_stored_back_to_back_into_one_slice() -> None:
    mapping = memoryview(bytes(range(256)) * 4)  # the file [1000, 2024)
    units = b"".join(
        CQ_UNIT.pack(phy, size, tag)
        for phy, size, tag in [(1000, 10, 1), (1010, 20, 2), (1030, 5, 1), (1040, 5, 1), (1045, 7, 1), (1000, 4, 1)]
    )
    for fn in _collect_twins():
        messages: list[memoryview] = []
        offsets: list[int] = []
        # Three runs: [1000, 1035), [1040, 1052), then a record back at 1000 (its own slice).
        assert fn(units, 0, 6, mapping, 1000, 2024, 0, 32, 1 << 20, 0, None, messages, offsets, 7, True) == (
            6, 51, 1000, 0,
        )  # fmt: skip
        assert [bytes(m) for m in messages] == [bytes(mapping[0:35]), bytes(mapping[40:52]), bytes(mapping[0:4])]
        assert offsets == [7, 8, 9, 10, 11, 12]  # one per message, however they are sliced
        # A unit the tag filter skips breaks the run; the messages limit counts messages, not slices.
        messages, offsets = [], []
        got = fn(units, 0, 6, mapping, 1000, 2024, 0, 3, 1 << 20, 0, {1}, messages, offsets, 0, True)
        assert got == (4, 20, 1040, 1)
        assert [bytes(m) for m in messages] == [bytes(mapping[0:10]), bytes(mapping[30:35]), bytes(mapping[40:45])]
        assert offsets == [0, 2, 3]
        # Without coalesce, one slice a record as before.
        messages, offsets = [], []
        assert fn(units, 0, 3, mapping, 1000, 2024, 0, 32, 1 << 20, 0, None, messages, offsets, 0, False)[0] == 3
        assert len(messages) == 3


def _collect_twins() -> list[fastpath.CollectUnits]:
    twins: list[fastpath.CollectUnits] = [fastpath.py_collect_units]
    try:
        from data_plane.store import _speedups
    except ImportError:
        return twins
    return [*twins, _speedups.collect_units]
