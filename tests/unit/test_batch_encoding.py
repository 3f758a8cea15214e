"""The producer's SEND_BATCH_MESSAGE body: the compiled layout of plain messages
(_records.plain_batch_body) against the Python one (sdk.protocol.py_batch_body), and what
sdk.protocol.batch_body hands to each."""

from __future__ import annotations

import random
from types import ModuleType

import pytest

from data_plane.remoting.bodies import decode_batch
from data_plane.store.message import decode_properties
from sdk import IllegalMessageError, Message
from sdk.message import new_unique_ids
from sdk.protocol import batch_body, py_batch_body

SEEDS = [1, 2, 3, 4, 5]


def _plain(rng: random.Random) -> Message:
    body = rng.randbytes(rng.randrange(1, 3000))
    kind = rng.randrange(3)
    wrapped: bytes | bytearray | memoryview = body if kind == 0 else bytearray(body) if kind == 1 else memoryview(body)
    tags = rng.choice([None, "a", "TagA", "é中", "t" * 255, "x y"])
    return Message(rng.choice(["Orders", "%RETRY%g-1"]), wrapped, tags=tags)


def _not_plain(rng: random.Random) -> Message:
    how = rng.randrange(4)
    if how == 0:
        return Message("Orders", b"p", properties={"k": "v"})
    if how == 1:
        return Message("Orders", b"k", keys="order-1")
    if how == 2:
        return Message("Orders", b"d", delay_level=3)
    return Message("Orders", b"t", deliver_at_ms=1_700_000_000_000)


@pytest.mark.parametrize("seed", SEEDS)
def test_compiled_layout_equals_the_python_one(records: ModuleType, seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(40):
        msgs = [_plain(rng) for _ in range(rng.randrange(1, 40))]
        uids = new_unique_ids(len(msgs))
        expected = py_batch_body(msgs, uids)
        assert records.plain_batch_body(msgs, uids, Message) == expected
        assert batch_body(msgs, uids) == expected
        items = decode_batch(expected)
        assert [(flag, body) for flag, body, _ in items] == [(0, m.body) for m in msgs]
        for (_, _, raw), m, uid in zip(items, msgs, uids, strict=True):
            assert decode_properties(raw.decode()) == m.wire_properties(uid)


@pytest.mark.parametrize("seed", SEEDS)
def test_a_message_that_is_not_plain_goes_to_python(records: ModuleType, seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(20):
        msgs = [_plain(rng) for _ in range(rng.randrange(0, 10))]
        msgs.insert(rng.randrange(len(msgs) + 1), _not_plain(rng))
        uids = new_unique_ids(len(msgs))
        assert records.plain_batch_body(msgs, uids, Message) is None
        body = batch_body(msgs, uids)
        assert body == py_batch_body(msgs, uids)
        props = [decode_properties(raw.decode()) for _, _, raw in decode_batch(body)]
        assert props == [m.wire_properties(uid) for m, uid in zip(msgs, uids, strict=True)]


def test_properties_over_their_two_byte_length_go_to_python(records: ModuleType) -> None:
    msgs = [Message("Orders", b"x", tags="t")]
    long_id = ["U" * 70_000]
    assert records.plain_batch_body(msgs, long_id, Message) is None
    with pytest.raises(IllegalMessageError, match="properties are 70027 bytes, over 65535"):
        batch_body(msgs, long_id)  # the Python layout says why


def test_one_unique_id_a_message(records: ModuleType) -> None:
    msgs = [Message("Orders", b"x"), Message("Orders", b"y")]
    with pytest.raises(ValueError, match="one unique id a message"):
        records.plain_batch_body(msgs, ["only-one"], Message)
    with pytest.raises(TypeError):
        records.plain_batch_body(tuple(msgs), ["a", "b"], Message)
    assert records.plain_batch_body([], [], Message) == b""


class _TracedMessage(Message):
    """A subclass with properties of its own making: the compiled layout must not skip it."""

    __slots__ = ()

    def encoded_properties(self, unique_id: str) -> bytes:
        return super().encoded_properties(unique_id) + b"mine\x01yes\x02"


def test_a_subclass_of_message_goes_to_python(records: ModuleType) -> None:
    msgs = [Message("Orders", b"a"), _TracedMessage("Orders", b"b")]
    uids = new_unique_ids(2)
    assert records.plain_batch_body(msgs, uids, Message) is None
    props = [decode_properties(raw.decode()) for _, _, raw in decode_batch(batch_body(msgs, uids))]
    assert props[1]["mine"] == "yes"
