"""The gRPC endpoint's protobuf conversions, the compiled twin (data_plane/proxy/_v2_codec.c)
against the Python one (v2_codec.PythonV2Codec, the service's own path restated): a
SendMessageRequest read into a SEND_BATCH_MESSAGE body, on generated requests, plain and not, and
on damaged bytes; a stored message written as the ReceiveMessageResponse handing it out. The
compiled one may leave something to the service (None) but never does it differently."""

from __future__ import annotations

import hashlib
import random
from types import ModuleType

from data_plane.broker.pop import Lease
from data_plane.broker.transaction_check import encode_record
from data_plane.proxy.answers import varint
from data_plane.proxy.messages import SYSTEM_PROPERTIES
from data_plane.proxy.v2 import definition_pb2 as pb
from data_plane.proxy.v2 import service_pb2 as rpc
from data_plane.proxy.v2_codec import PYTHON, PlainBatch
from data_plane.remoting.bodies import decode_batch
from data_plane.store.message import StoredMessage, decode_properties

MAX_BODY = 4096
NOW_MS = 1_765_000_000_123
TOPIC = "acme%orders"


def _text(rng: random.Random, n: int) -> str:
    return "".join(rng.choice("abcXYZ019_-.:é中") for _ in range(n))


def _ascii(rng: random.Random, n: int) -> str:
    return "".join(rng.choice("abcXYZ019_-.: ") for _ in range(n))


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


def _stored(rng: random.Random, *, odd: bool, topic: str = TOPIC) -> StoredMessage:
    """A stored message; with ``odd``, one the compiled writer leaves to the reference."""
    props: dict[str, str] = {"UNIQ_KEY": _ascii(rng, rng.randrange(0, 34))}
    if rng.random() < 0.7:
        props["TAGS"] = _ascii(rng, rng.randrange(0, 12))
    if rng.random() < 0.5:
        props["KEYS"] = " ".join(_ascii(rng, rng.randrange(1, 9)) for _ in range(rng.randrange(1, 4)))
        if rng.random() < 0.3:
            props["KEYS"] = "  " + props["KEYS"] + " "
    if rng.random() < 0.3:
        props["__SHARDINGKEY"] = _ascii(rng, rng.randrange(0, 9))
    if rng.random() < 0.5:
        props["V5_TYPE"] = rng.choice(["1", "2", "3", "4", "5", "x", ""])
    if rng.random() < 0.3:
        props[rng.choice(["TIMER_OUT_MS", "TIMER_DELIVER_MS"])] = rng.choice(
            [str(rng.randrange(1, 10**13)), "", "12a", "9" * 16, "0"]
        )
    if rng.random() < 0.3:
        props["traceparent"] = rng.choice(["", "00-abc-def-01"])
    for _ in range(rng.randrange(0, 3)):
        props[_ascii(rng, rng.randrange(0, 8))] = _ascii(rng, rng.randrange(0, 8))
    if rng.random() < 0.3:
        props[rng.choice(["WAIT", "REAL_TOPIC", "PGROUP", "DELAY"])] = "v"
    if odd:  # what the compiled one leaves to the reference
        how = rng.randrange(4)
        if how == 0:
            props["KEYS"] = rng.choice(["a\tb", "a\x1cb", "x\ny"])  # whitespace to str.split, not only spaces
        elif how == 1:
            props["KEYS"] = "é\u00a0x"  # not ASCII (and a no-break space: whitespace to str.split)
        elif how == 2:
            props["region"] = _text(rng, 6) + "中"
        else:
            props.pop("TIMER_OUT_MS", None)  # (read first when it is there)
            props["TIMER_DELIVER_MS"] = "١٢٣"  # digits, but not ASCII ones
    return StoredMessage(
        total_size=0, body_crc=0, queue_id=rng.choice([0, 3, 2**31 - 1]), flag=rng.choice([0, 1, 4]),
        queue_offset=rng.choice([0, 7, rng.randrange(2**40)]), commit_log_offset=rng.choice([0, 4096, 2**50 + 3]),
        sys_flag=0, born_timestamp=rng.choice([0, 1, 1_700_000_000_123, -1500]),
        born_host=(rng.choice(["10.0.0.1", "0.0.0.0", "255.1.2.3"]), 5000),
        store_timestamp=rng.choice([1_700_000_001_999, 999]),
        store_host=("10.0.0.2", rng.choice([0, 10911, -1])), reconsume_times=0, prepared_transaction_offset=0,
        body=rng.randbytes(rng.choice([0, 1, 55, 56, 63, 64, 119, 120, rng.randrange(0, 1500)])), topic=topic,
        properties=props,
    )  # fmt: skip


def _record(rec: StoredMessage) -> bytes:
    return encode_record(rec, rec.topic, rec.queue_id)


def test_both_twins_write_received_records_alike(v2_codec: ModuleType, seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(200):
        odd = [rng.random() < 0.15 for _ in range(rng.randrange(1, 9))]
        stored = [_stored(rng, odd=o) for o in odd]
        records: list[bytes | memoryview] = [_record(r) for r in stored]
        if rng.random() < 0.5:
            records = [memoryview(r) for r in records]
        args = (
            records, TOPIC, rng.choice(["acme", ""]), "orders", rng.randrange(8), rng.randrange(2**64),
            rng.randrange(1, 17), rng.choice([10, 1500, 60_000, 43_200_000]), SYSTEM_PROPERTIES,
        )  # fmt: skip
        compiled = v2_codec.received_records(*args)
        python = PYTHON.received_records(*args)
        assert len(compiled) == len(python) == len(records)
        for rec, o, got_bytes, want_bytes in zip(stored, odd, compiled, python, strict=True):
            assert want_bytes is not None
            if o:
                assert got_bytes is None, f"seed {seed}: the compiled twin wrote what it should leave to the reference"
                continue
            assert got_bytes is not None, f"seed {seed}: the compiled twin left an ordinary record to the reference"
            assert got_bytes[:5] == b"\x00" + len(got_bytes[5:]).to_bytes(4, "big"), f"seed {seed}: not framed"
            got, want = (rpc.ReceiveMessageResponse.FromString(x[5:]) for x in (got_bytes, want_bytes))
            assert got == want, f"seed {seed}: {rec.properties}"
            assert got.message.system_properties.body_digest.checksum == hashlib.md5(rec.body).hexdigest().upper()


def test_records_the_compiled_writer_does_not_take_are_left_to_the_reference(v2_codec: ModuleType) -> None:
    rng = random.Random(5)
    rec = _stored(rng, odd=False)
    rec.properties["UNIQ_KEY"] = "id-1"
    good = _record(rec)
    other_topic = _record(_stored(rng, odd=False, topic="acme%other"))
    torn = good[:-1] + b"\x00"  # properties not ending with their separator
    bad_magic = good[:4] + b"\x00\x00\x00\x00" + good[8:]
    rec.properties["KEYS"] = "a"
    # A name twice: a dict keeps one of them.
    twice = _fix_sizes(_record(rec).replace(b"KEYS\x01a\x02", b"KEYS\x01a\x02KEYS\x01b\x02"))
    args = (TOPIC, "acme", "orders", 1, 7, 1, 30_000, SYSTEM_PROPERTIES)
    got = v2_codec.received_records([good, other_topic, torn, bad_magic, twice, good[:-3]], *args)
    assert got[0] is not None
    assert got[1:] == [None] * 5
    # The reference writes the other topic's record with that topic's own resource.
    (other,) = PYTHON.received_records([other_topic], *args)
    assert other is not None
    assert rpc.ReceiveMessageResponse.FromString(other[5:]).message.topic.name == "other"


def _fix_sizes(record: bytes) -> bytes:
    """``record`` with its total size and properties length made to fit its bytes again."""
    body_len = int.from_bytes(record[84:88], "big")
    topic_len = record[88 + body_len]
    at = 88 + body_len + 1 + topic_len
    props = record[at + 2 :]
    return len(record).to_bytes(4, "big") + record[4:at] + len(props).to_bytes(2, "big") + props


def test_the_compiled_md5_is_hashlibs(v2_codec: ModuleType, seed: int) -> None:
    rng = random.Random(seed)
    for n in [*range(200), 1024, 4096, 65536, rng.randrange(10**6)]:
        data = rng.randbytes(n)
        assert v2_codec.md5_upper(data) == hashlib.md5(data).hexdigest().upper(), f"seed {seed}: {n} bytes"


def test_both_twins_lease_a_receives_new_records_alike(v2_codec: ModuleType, seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(200):
        n = rng.randrange(0, 40)
        first = rng.randrange(10**6)
        stored = []
        for i in range(n):
            rec = _stored(rng, odd=False)
            rec.queue_offset = first + i
            rec.properties.pop("region", None)
            if rng.random() < 0.5:
                rec.properties["TAGS"] = rng.choice(["a", "b", "c"])
            stored.append(rec)
        records: list[bytes | memoryview] = [memoryview(_record(r)) for r in stored]
        stop = rng.random() < 0.2 and n > 0
        if stop:  # a record it stops at: not a sound one of the topic
            at = rng.randrange(n)
            records[at] = memoryview(_record(_stored(rng, odd=False, topic="acme%other")))
        held = {first + i: Lease(1, 1, 1) for i in range(n) if rng.random() < 0.2}
        finished = {first + i for i in range(n) if rng.random() < 0.1} - held.keys()
        tags = rng.choice([None, frozenset({"a"}), frozenset({"a", "c"}), frozenset()])
        want = rng.randrange(1, 40)
        lease = Lease(10**13, 1, rng.randrange(2**64))
        outcome = []
        for twin in (v2_codec, PYTHON):
            leases, done = dict(held), set(finished)
            got = twin.lease_scan(records, TOPIC, leases, done, tags, want, lease)
            outcome.append((got, leases, done))
        (c_got, c_leases, c_done), (p_got, p_leases, p_done) = outcome
        assert c_got == p_got, f"seed {seed}"
        assert (c_leases, c_done) == (p_leases, p_done), f"seed {seed}"
        offsets, taken, filtered, looked, after, body_bytes = c_got
        assert len(offsets) <= want
        assert all(c_leases[o] is lease for o in offsets)
        assert [bytes(r) for r in taken] == [bytes(records[o - first]) for o in offsets]
        assert body_bytes == sum(len(stored[o - first].body) for o in offsets)
        assert not set(offsets) & held.keys()
        assert not set(offsets) & finished
        assert all(tags is None or stored[o - first].properties.get("TAGS") in tags for o in offsets)
        assert all(stored[o - first].properties.get("TAGS") not in (tags or ()) for o in filtered)
        assert after == (first + looked if looked else -1)


def test_the_compiled_scan_stops_at_properties_it_does_not_read(v2_codec: ModuleType) -> None:
    rng = random.Random(9)
    stored = [_stored(rng, odd=False) for _ in range(3)]
    for i, rec in enumerate(stored):
        rec.queue_offset = i
    stored[1].properties["region"] = "中"  # not ASCII: the scan's own loop decodes it
    records: list[bytes | memoryview] = [_record(r) for r in stored]
    not_utf8 = _fix_sizes(_record(stored[2]).replace(b"UNIQ_KEY\x01", b"UNIQ_KEY\x01\xff\xfe"))
    lease = Lease(1, 1, 1)
    for tags in (None, frozenset({stored[0].properties.get("TAGS", "")})):
        leases: dict[int, Lease] = {}
        got = v2_codec.lease_scan(records, TOPIC, leases, set(), tags, 9, lease)
        assert got[3:5] == (1, 1)
        assert leases.keys() <= {0}
        # Bytes that are not UTF-8 stop both twins (the reference cannot decode them), filter or not.
        for twin in (v2_codec, PYTHON):
            leases = {}
            assert twin.lease_scan([not_utf8], TOPIC, leases, set(), tags, 9, lease) == ([], [], [], 0, -1, 0)
            assert leases == {}


def test_a_queue_offset_no_queue_has_stops_the_scan(v2_codec: ModuleType) -> None:
    rng = random.Random(11)
    lease = Lease(1, 1, 1)
    for offset in (-1, 2**63 - 1):  # a header the body CRC does not cover, read as such
        rec = _stored(rng, odd=False)
        rec.queue_offset = offset
        for twin in (v2_codec, PYTHON):
            leases: dict[int, Lease] = {}
            assert twin.lease_scan([_record(rec)], TOPIC, leases, set(), None, 9, lease) == ([], [], [], 0, -1, 0)
