"""SEND_BATCH_MESSAGE bodies into store Messages, and the message ids of a batch's records:
the compiled twins (_batch.batch_messages, _speedups.batch_ids) against the Python ones
(data_plane/broker/send.py, data_plane/store/fastpath.py), on random bodies, well formed and not."""

from __future__ import annotations

import random
import struct
from types import ModuleType

from data_plane.broker.batch_decode import py_batch_messages
from data_plane.remoting.bodies import MAX_BATCH_MESSAGES, encode_batch_item
from data_plane.remoting.errors import HeaderError
from data_plane.store.fastpath import py_batch_ids
from data_plane.store.message import Message, encode_properties, pack_host

BORN = pack_host("10.1.2.3", 4567)
ARGS = ("Orders", 3, 0, 1_700_000_000_000, BORN, 2)


def _item(rng: random.Random) -> bytes:
    names = ["TAGS", "KEYS", "UNIQ_KEY", "WAIT", "k", "TAGSX", "中"]
    props = {rng.choice(names): rng.choice(["true", "a b", "x" * rng.randrange(0, 30), "é"]) for _ in range(3)}
    raw = encode_properties(props) if rng.random() < 0.9 else b"NOVALUE\x02" + encode_properties(props)
    return encode_batch_item(rng.randbytes(rng.randrange(0, 2000)), rng.randrange(-(2**31), 2**31), raw)


def _damage(rng: random.Random, body: bytes) -> bytes:
    """One of the ways a batch body is not well formed."""
    b = bytearray(body)
    how = rng.randrange(6) if len(b) >= 22 else 4
    if how == 0 and b:
        return bytes(b[: rng.randrange(len(b))])  # cut short
    if how == 1:
        struct.pack_into(">i", b, 0, rng.choice([0, 21, len(b) + 1, -5]))  # first total size
    elif how == 2:
        struct.pack_into(">i", b, 16, rng.choice([-1, 2**30, len(b)]))  # first body length
    elif how == 3:
        return body + b"\x00" * rng.randrange(1, 22)  # trailing bytes
    elif how == 5:  # the first properties length disagrees with the total size
        (body_len,) = struct.unpack_from(">i", b, 16)
        (props_len,) = struct.unpack_from(">H", b, 20 + body_len)
        struct.pack_into(">H", b, 20 + body_len, (props_len + rng.choice([1, 2, 100, 65535])) % 65536)
    else:
        # Properties that are not UTF-8.
        item = encode_batch_item(b"x", 0, b"TAGS\x01\xff\xfe\x02")
        return body + item
    return bytes(b)


def test_both_twins_decode_batch_bodies_alike(batch: ModuleType, seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(300):
        body = b"".join(_item(rng) for _ in range(rng.randrange(0, 12)))
        if rng.random() < 0.4:
            body = _damage(rng, body)
        compiled = batch.batch_messages(body, Message, *ARGS, MAX_BATCH_MESSAGES)
        try:
            python = py_batch_messages(body, *ARGS)
        except HeaderError:
            assert compiled is None, f"seed {seed}: the compiled twin took a body the Python one refuses"
            continue
        assert compiled == python, f"seed {seed}"
        for m in compiled:
            assert (m.topic, m.queue_id, m.sys_flag, m.born_timestamp, m.born_host, m.reconsume_times) == (
                "Orders", 3, 0, 1_700_000_000_000, BORN, 2,
            )  # fmt: skip
            assert m.prepared_transaction_offset == 0


def test_the_compiled_twin_leaves_too_many_messages_to_the_python_one(batch: ModuleType) -> None:
    body = b"".join(encode_batch_item(b"x", 0, b"") for _ in range(5))
    assert len(batch.batch_messages(body, Message, *ARGS, 5)) == 5
    assert batch.batch_messages(body, Message, *ARGS, 4) is None


def test_both_twins_give_the_ids_of_records_lying_back_to_back(speedups: ModuleType, seed: int) -> None:
    rng = random.Random(seed)
    prefix = "0A01020300002A9F"
    for _ in range(100):
        sizes = [rng.randrange(22, 300) for _ in range(rng.randrange(1, 20))]
        file_from = rng.choice([0, 1 << 30, 5 << 30])
        start = rng.randrange(0, 64)
        mapping = bytearray(start + sum(sizes) + 8)
        at = start
        for size in sizes:
            struct.pack_into(">i", mapping, at, size)
            at += size
        offsets = [file_from + start + sum(sizes[:i]) for i in range(len(sizes))]
        expect = ",".join(prefix + format(o, "016X") for o in offsets)
        for twin in (speedups.batch_ids, py_batch_ids):
            assert twin(memoryview(mapping), file_from, file_from + start, len(sizes), prefix) == expect, f"seed {seed}"
            # Asked for more records than the buffer holds: None (the caller's own walk decides).
            assert twin(memoryview(mapping), file_from, file_from + start, len(sizes) + 2, prefix) is None
            # An offset before the buffer, or a record whose size field is not positive: None.
            assert twin(memoryview(mapping), file_from + start + 1, file_from + start, 1, prefix) is None
            bad = bytearray(mapping)
            struct.pack_into(">i", bad, offsets[-1] - file_from, rng.choice([0, -5]))
            assert twin(memoryview(bad), file_from, file_from + start, len(sizes), prefix) is None
