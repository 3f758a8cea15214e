"""The gRPC endpoint's protobuf conversions, the compiled twin (data_plane/proxy/_v2_codec.c)
against the Python one (v2_codec.PythonV2Codec, the service's own path restated): a
SendMessageRequest read into a SEND_BATCH_MESSAGE body, on generated requests, plain and not, and
on damaged bytes; a stored message written as the ReceiveMessageResponse handing it out. The
compiled one may leave something to the service (None) but never does it differently."""

from __future__ import annotations

import random
from types import ModuleType

from data_plane.proxy.answers import varint
from data_plane.proxy.messages import SYSTEM_PROPERTIES
from data_plane.proxy.v2 import definition_pb2 as pb
from data_plane.proxy.v2 import service_pb2 as rpc
from data_plane.proxy.v2_codec import PYTHON, PlainBatch
from data_plane.remoting.bodies import decode_batch
from data_plane.store.message import StoredMessage, decode_properties

MAX_BODY = 4096
NOW_MS = 1_765_000_000_123


def _text(rng: random.Random, n: int) -> str:
    return "".join(rng.choice("abcXYZ019_-.:é中") for _ in range(n))


def _odd(rng: random.Random, m: pb.Message) -> None:
    """One of the things a plain batch may not hold."""
    sp = m.system_properties
    how = rng.randrange(12)
    if how == 0:
        m.user_properties["region"] = "eu"
    elif how == 1:
        sp.message_type, sp.message_group = pb.FIFO, "g1"
    elif how == 2:
        sp.message_type = pb.DELAY
        sp.delivery_timestamp.seconds = 4_000_000_000
    elif how == 3:
        sp.tag = rng.choice(["", "a|b", "x" * 129, "tab\there"])
    elif how == 4:
        sp.keys.append(rng.choice(["", "a b", "k" * 129, "x\x01y"]))
    elif how == 5:
        sp.message_id = rng.choice(["", "i" * 129, "id\x02"])
    elif how == 6:
        m.body = rng.choice([b"", b"x" * (MAX_BODY + 1)])
    elif how == 7:
        m.topic.name = rng.choice(["other", ""])
    elif how == 8:
        m.topic.resource_namespace = "other"
    elif how == 9:
        sp.message_type = pb.TRANSACTION
    elif how == 10:
        sp.keys.extend(f"k{i}" for i in range(33))
    else:
        sp.trace_context = "00-\x01-01"


def _message(rng: random.Random, *, odd: bool) -> pb.Message:
    """A plain NORMAL message; with ``odd``, sometimes one that is not plain."""
    topic = pb.Resource(name="orders", resource_namespace="acme")
    m = pb.Message(topic=topic, body=rng.randbytes(rng.randrange(1, 600)))
    sp = m.system_properties
    sp.message_id = _text(rng, rng.randrange(1, 40))
    sp.message_type = rng.choice([pb.NORMAL, pb.MESSAGE_TYPE_UNSPECIFIED])
    if rng.random() < 0.7:
        sp.tag = _text(rng, rng.randrange(1, 20))
    sp.keys.extend(_text(rng, rng.randrange(1, 12)) for _ in range(rng.randrange(0, 4)))
    if rng.random() < 0.5:
        sp.born_timestamp.seconds = rng.randrange(1, 2_000_000_000)
        sp.born_timestamp.nanos = rng.randrange(0, 1_000_000_000)
    if rng.random() < 0.3:
        sp.trace_context = _text(rng, rng.choice([0, 5, 55, 600]))
    if rng.random() < 0.3:
        sp.body_digest.type = pb.MD5
        sp.body_digest.checksum = "0123456789ABCDEF"
    if rng.random() < 0.3:
        sp.born_host = "10.0.0.7"
    if rng.random() < 0.2:
        sp.body_encoding = pb.IDENTITY
    if odd and rng.random() < 0.5:
        _odd(rng, m)
    return m


def _request(rng: random.Random, *, odd: bool) -> tuple[bytes, bool]:
    """A request's bytes, and whether every message in it is plain."""
    n = rng.choice([1, 2, 3, 8, 32, 64, 65]) if odd else rng.choice([1, 2, 3, 8, 32, 64])
    msgs = [_message(rng, odd=odd) for _ in range(n)]
    one_topic = all(m.topic == msgs[0].topic and m.topic.name for m in msgs)
    plain = 1 <= n <= 64 and one_topic and all(m == _message_plain(m) for m in msgs)
    return rpc.SendMessageRequest(messages=msgs).SerializeToString(), plain


def _message_plain(m: pb.Message) -> pb.Message:
    """``m`` when it is one of the plain messages ``_message`` makes, else a different one."""
    sp = m.system_properties
    tag_ok = not sp.HasField("tag") or (0 < len(sp.tag) <= 20 and "|" not in sp.tag and "\t" not in sp.tag)
    keys_ok = len(sp.keys) <= 3 and all(k and " " not in k and len(k) <= 12 and "\x01" not in k for k in sp.keys)
    id_ok = 0 < len(sp.message_id) <= 40 and "\x02" not in sp.message_id
    oddities = (
        m.user_properties, sp.HasField("message_group"), sp.HasField("delivery_timestamp"),
        sp.message_type not in (pb.NORMAL, pb.MESSAGE_TYPE_UNSPECIFIED), not tag_ok, not keys_ok, not id_ok,
        not 0 < len(m.body) <= MAX_BODY, "\x01" in sp.trace_context,
    )  # fmt: skip
    return m if not any(oddities) else pb.Message()


def test_both_twins_read_plain_requests_alike_and_the_compiled_one_takes_every_plain_one(
    v2_codec: ModuleType, seed: int
) -> None:
    rng = random.Random(seed)
    for _ in range(300):
        payload, plain = _request(rng, odd=rng.random() < 0.5)
        compiled = v2_codec.plain_batch(payload, 64, MAX_BODY, NOW_MS)
        python = PYTHON.plain_batch(payload, 64, MAX_BODY, NOW_MS)
        assert (python is not None) == plain, f"seed {seed}: the reference twin misjudged a request"
        if plain:
            assert compiled is not None, f"seed {seed}: the compiled twin left a plain request to the service"
        if compiled is not None:
            assert PlainBatch._make(compiled) == python, f"seed {seed}"


def test_the_batch_body_holds_each_message_with_its_v5_properties(v2_codec: ModuleType) -> None:
    msgs = [
        pb.Message(topic=pb.Resource(name="orders"), body=b"one"),
        pb.Message(topic=pb.Resource(name="orders"), body=b"two"),
    ]
    a, b = (m.system_properties for m in msgs)
    a.message_id, a.tag, a.born_timestamp.seconds, a.born_timestamp.nanos = "ID-1", "paid", 1_700_000_000, 5_000_000
    a.keys.extend(["k1", "k2"])
    b.message_id, b.trace_context = "ID-2", "00-abc-01"
    got = v2_codec.plain_batch(rpc.SendMessageRequest(messages=msgs).SerializeToString(), 64, 100, NOW_MS)
    assert got is not None
    batch = PlainBatch._make(got)
    assert (batch.namespace, batch.name, batch.message_ids) == ("", "orders", ["ID-1", "ID-2"])
    assert (batch.born_ms, batch.body_bytes) == (1_700_000_000_005, 6)
    (f1, b1, p1), (f2, b2, p2) = decode_batch(batch.items)
    assert (f1, b1, f2, b2) == (0, b"one", 0, b"two")
    assert decode_properties(p1) == {"UNIQ_KEY": "ID-1", "TAGS": "paid", "KEYS": "k1 k2", "V5_TYPE": "1"}
    assert decode_properties(p2) == {"UNIQ_KEY": "ID-2", "traceparent": "00-abc-01", "V5_TYPE": "1"}
    # No born time: the batch's is the time given.
    a.ClearField("born_timestamp")
    got = v2_codec.plain_batch(rpc.SendMessageRequest(messages=msgs).SerializeToString(), 64, 100, NOW_MS)
    assert got is not None
    assert PlainBatch._make(got).born_ms == NOW_MS


def test_the_compiled_twin_leaves_what_it_does_not_know_to_the_service(v2_codec: ModuleType) -> None:
    msgs = [pb.Message(topic=pb.Resource(name="t"), body=b"x") for _ in range(2)]
    for i, m in enumerate(msgs):
        m.system_properties.message_id = f"id{i}"
    plain = rpc.SendMessageRequest(messages=msgs).SerializeToString()
    assert v2_codec.plain_batch(plain, 64, 100, NOW_MS) is not None
    unknown_field = plain + varint(9 << 3) + varint(1)  # a field the request does not define
    assert v2_codec.plain_batch(unknown_field, 64, 100, NOW_MS) is None
    twice = rpc.SendMessageRequest(messages=msgs).SerializeToString()
    twice = twice.replace(b"\x22\x01x", b"\x22\x01x\x22\x01y", 1)  # a body given twice (the last counts)
    assert v2_codec.plain_batch(twice, 64, 100, NOW_MS) is None
    assert v2_codec.plain_batch(plain, 1, 100, NOW_MS) is None  # more messages than allowed
    one = rpc.SendMessageRequest(messages=msgs[:1]).SerializeToString()
    assert v2_codec.plain_batch(one, 64, 100, NOW_MS) == PYTHON.plain_batch(one, 64, 100, NOW_MS)  # a batch of one
    assert v2_codec.plain_batch(b"", 64, 100, NOW_MS) is None  # no message: the service says so
    invalid_utf8 = plain.replace(b"id0", b"i\xff0")
    assert v2_codec.plain_batch(invalid_utf8, 64, 100, NOW_MS) is None
    assert PYTHON.plain_batch(invalid_utf8, 64, 100, NOW_MS) is None  # (protobuf refuses it too)


def test_damaged_requests_are_read_alike_or_left_to_the_service(v2_codec: ModuleType, seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(400):
        payload, _plain = _request(rng, odd=False)
        b = bytearray(payload)
        for _ in range(rng.randrange(1, 4)):
            how = rng.randrange(3)
            if how == 0 and b:
                b = b[: rng.randrange(len(b))]
            elif how == 1 and b:
                b[rng.randrange(len(b))] = rng.randrange(256)
            else:
                b[rng.randrange(len(b) + 1) : 0] = rng.randbytes(rng.randrange(1, 6))
        compiled = v2_codec.plain_batch(bytes(b), 64, MAX_BODY, NOW_MS)
        if compiled is not None:
            assert PlainBatch._make(compiled) == PYTHON.plain_batch(bytes(b), 64, MAX_BODY, NOW_MS), f"seed {seed}"


def _stored(rng: random.Random, *, odd: bool) -> StoredMessage:
    props: dict[str, str] = {"UNIQ_KEY": _text(rng, rng.randrange(0, 34))}
    if rng.random() < 0.7:
        props["TAGS"] = _text(rng, rng.randrange(0, 12))
    if rng.random() < 0.5:
        props["KEYS"] = " ".join(_text(rng, rng.randrange(1, 9)) for _ in range(rng.randrange(1, 4)))
        if rng.random() < 0.3:
            props["KEYS"] = "  " + props["KEYS"] + " "
    if rng.random() < 0.3:
        props["__SHARDINGKEY"] = _text(rng, rng.randrange(0, 9))
    if rng.random() < 0.5:
        props["V5_TYPE"] = rng.choice(["1", "2", "3", "4", "5", "x", ""])
    if rng.random() < 0.3:
        props[rng.choice(["TIMER_OUT_MS", "TIMER_DELIVER_MS"])] = rng.choice(
            [str(rng.randrange(1, 10**13)), "", "12a", "9" * 16, "0"]
        )
    if rng.random() < 0.3:
        props["traceparent"] = rng.choice(["", "00-abc-def-01"])
    for _ in range(rng.randrange(0, 3)):
        props[_text(rng, rng.randrange(1, 8))] = _text(rng, rng.randrange(0, 8))
    if rng.random() < 0.3:
        props[rng.choice(["WAIT", "REAL_TOPIC", "PGROUP", "DELAY"])] = "v"
    if odd:  # what the compiled one leaves to the reference
        how = rng.randrange(3)
        if how == 0:
            props["KEYS"] = "a\tb"
        elif how == 1:
            props["KEYS"] = "é\u00a0x"  # a no-break space: whitespace to str.split
        else:
            props.pop("TIMER_OUT_MS", None)  # (read first when it is there)
            props["TIMER_DELIVER_MS"] = "١٢٣"  # digits, but not ASCII ones
    return StoredMessage(
        total_size=200, body_crc=0, queue_id=rng.choice([0, 3, 2**31 - 1]), flag=rng.choice([0, 1, 4]),
        queue_offset=rng.choice([0, 7, 2**40]), commit_log_offset=4096, sys_flag=0,
        born_timestamp=rng.choice([0, 1, 1_700_000_000_123, -1500]), born_host=(rng.choice(["10.0.0.1", ""]), 5000),
        store_timestamp=rng.choice([1_700_000_001_999, 999]), store_host=("10.0.0.2", rng.choice([0, 10911])),
        reconsume_times=0, prepared_transaction_offset=0, body=rng.randbytes(rng.randrange(0, 300)),
        topic="acme%orders", properties=props,
    )  # fmt: skip


def test_both_twins_write_received_messages_alike(v2_codec: ModuleType, seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(500):
        odd = rng.random() < 0.2
        rec = _stored(rng, odd=odd)
        args = (
            rec, rec.properties["UNIQ_KEY"] or rec.msg_id, _text(rng, 32), rng.choice(["acme", ""]), "orders",
            f"{rng.randrange(8)}:{rng.randrange(10**6)}:{rng.randrange(2**64):016x}", rng.randrange(1, 17),
            rng.choice([10, 1500, 60_000, 43_200_000]), SYSTEM_PROPERTIES,
        )  # fmt: skip
        compiled = v2_codec.received_message(*args)
        python = PYTHON.received_message(*args)
        assert python is not None
        if odd:
            assert compiled is None, f"seed {seed}: the compiled twin wrote what it should leave to the reference"
            continue
        assert compiled is not None, f"seed {seed}: the compiled twin left an ordinary message to the reference"
        assert compiled[:5] == b"\x00" + len(compiled[5:]).to_bytes(4, "big"), f"seed {seed}: not framed"
        got, want = (rpc.ReceiveMessageResponse.FromString(x[5:]) for x in (compiled, python))
        assert got == want, f"seed {seed}: {rec.properties}"
