"""Request and response bodies (data_plane/remoting/bodies.py): the lenient JSON reader for
fastjson output (unquoted integer map keys), message-queue validation, and the SEND_BATCH_MESSAGE
binary body (encode_batch_item / decode_batch), including refusal of malformed batches."""

from __future__ import annotations

import random
import struct

import pytest

from data_plane.remoting.bodies import (
    BATCH_ITEM_HEAD,
    decode_batch,
    dumps,
    encode_batch_item,
    loads,
    loads_object,
    message_queue,
    topic_config,
)
from data_plane.remoting.errors import HeaderError


# --- lenient JSON --------------------------------------------------------------------------------
def test_loads_reads_fastjson_integer_map_keys_as_strings() -> None:
    body = b'{"brokerAddrs":{0:"127.0.0.1:10911",1:"127.0.0.1:10921"}}'
    assert loads(body) == {"brokerAddrs": {"0": "127.0.0.1:10911", "1": "127.0.0.1:10921"}}


def test_loads_reads_a_whole_fastjson_route_with_bare_keys_spaces_and_negative_keys() -> None:
    body = (
        b'{"brokerDatas":[{"brokerAddrs":{ 0 :"10.0.0.1:10911", -1:"x"},"brokerName":"broker-a",'
        b'"cluster":"DefaultCluster"}],"filterServerTable":{},"queueDatas":[{"brokerName":"broker-a",'
        b'"perm":6,"readQueueNums":4,"topicSynFlag":0,"writeQueueNums":4}]}'
    )
    route = loads_object(body)
    assert route["brokerDatas"][0]["brokerAddrs"] == {"0": "10.0.0.1:10911", "-1": "x"}
    assert route["queueDatas"][0]["readQueueNums"] == 4
    assert route["filterServerTable"] == {}


def test_loads_leaves_strings_that_look_like_bare_keys_alone() -> None:
    # Only keys are quoted: text inside string values stays as it was written.
    body = b'{"brokerAddrs":{0:"a"},"note":"x,1:y","expr":"{2:3}","esc":"q\\",4:z"}'
    assert loads(body) == {"brokerAddrs": {"0": "a"}, "note": "x,1:y", "expr": "{2:3}", "esc": 'q",4:z'}


def test_loads_reads_standard_json_unchanged() -> None:
    assert loads(b'{"a":[1,2,{"3":"4"}],"b":"0:1"}') == {"a": [1, 2, {"3": "4"}], "b": "0:1"}
    assert loads(bytearray(b"[1]")) == [1]
    assert loads(memoryview(b'"s"')) == "s"


@pytest.mark.parametrize("body", [None, b"", bytearray(), memoryview(b"")])
def test_loads_refuses_a_missing_body(body: bytes | bytearray | memoryview | None) -> None:
    with pytest.raises(HeaderError, match="no body"):
        loads(body)


@pytest.mark.parametrize("body", [b"{", b"{a:1}", b"\xff\xfe", b'{"a":1,}', b"{0:}"])
def test_loads_refuses_what_is_not_json_even_leniently(body: bytes) -> None:
    with pytest.raises(HeaderError, match="not JSON"):
        loads(body)


def test_loads_object_refuses_a_body_that_is_not_an_object() -> None:
    with pytest.raises(HeaderError, match="not a JSON object"):
        loads_object(b"[1,2]")


def test_dumps_writes_json_that_loads_reads_back() -> None:
    cfg = topic_config("T", 8, 4, perm=2, order=True)
    assert loads(dumps({"topicConfigTable": {"T": cfg}})) == {"topicConfigTable": {"T": cfg}}
    assert cfg["topicName"] == "T"
    assert (cfg["readQueueNums"], cfg["writeQueueNums"], cfg["perm"], cfg["order"]) == (8, 4, 2, True)


# --- message queues ------------------------------------------------------------------------------
def test_message_queue_reads_a_valid_queue() -> None:
    assert message_queue({"topic": "T", "brokerName": "b", "queueId": 3}) == {
        "topic": "T",
        "brokerName": "b",
        "queueId": 3,
    }


def test_message_queue_accepts_a_queue_id_written_as_a_string() -> None:
    assert message_queue({"topic": "T", "brokerName": "b", "queueId": "3"})["queueId"] == 3


@pytest.mark.parametrize(
    "value",
    [
        None,
        [],
        "T",
        {"brokerName": "b", "queueId": 1},
        {"topic": "T", "queueId": 1},
        {"topic": "T", "brokerName": "b"},
        {"topic": "T", "brokerName": "b", "queueId": "x"},
        {"topic": "T", "brokerName": "b", "queueId": None},
        {"topic": "T", "brokerName": "b", "queueId": [1]},
    ],
)
def test_message_queue_refuses_a_malformed_queue(value: object) -> None:
    with pytest.raises(HeaderError, match="message queue"):
        message_queue(value)


# --- SEND_BATCH_MESSAGE body ---------------------------------------------------------------------
def java_batch_item(body: bytes, flag: int, properties: bytes) -> bytes:
    """MessageDecoder.encodeMessage, written from the Java layout."""
    total = 4 + 4 + 4 + 4 + 4 + len(body) + 2 + len(properties)
    return (
        struct.pack(">iiiii", total, 0xDAA320A7 - 2**32, 12345, flag, len(body))
        + body
        + struct.pack(">h", len(properties))
        + properties
    )


def test_a_batch_item_is_laid_out_as_java_writes_it_apart_from_magic_and_crc() -> None:
    item = encode_batch_item(b"hello", 7, b"KEYS\x01k1\x02")
    ref = java_batch_item(b"hello", 7, b"KEYS\x01k1\x02")
    assert len(item) == len(ref)
    assert item[:4] == ref[:4]
    assert item[12:] == ref[12:]


def test_a_batch_round_trips_through_encode_batch_item_and_decode_batch(seed: int) -> None:
    rng = random.Random(seed)
    items = [
        (rng.randrange(-(2**31), 2**31), rng.randbytes(rng.randrange(0, 300)), rng.randbytes(rng.randrange(0, 50)))
        for _ in range(50)
    ]
    items.append((0, b"", b""))
    body = b"".join(encode_batch_item(b, flag, p) for flag, b, p in items)
    assert decode_batch(body) == items
    assert decode_batch(memoryview(body)) == items


def test_decode_batch_reads_a_java_written_batch() -> None:
    body = java_batch_item(b"a", 0, b"TAGS\x01t\x02") + java_batch_item(b"bb", 1, b"")
    assert decode_batch(body) == [(0, b"a", b"TAGS\x01t\x02"), (1, b"bb", b"")]


def test_decode_batch_refuses_an_empty_batch() -> None:
    with pytest.raises(HeaderError, match="empty"):
        decode_batch(b"")


def test_decode_batch_refuses_a_batch_cut_at_any_byte() -> None:
    body = encode_batch_item(b"first", 0, b"p") + encode_batch_item(b"second", 0, b"pp")
    for cut in range(1, len(body)):
        if cut == len(encode_batch_item(b"first", 0, b"p")):
            assert len(decode_batch(body[:cut])) == 1  # a whole first message is a valid batch
            continue
        with pytest.raises(HeaderError):
            decode_batch(body[:cut])


def _item(total: int, body_len: int, body: bytes, props_len: int, props: bytes) -> bytes:
    return BATCH_ITEM_HEAD.pack(total, 0, 0, 0, body_len) + body + struct.pack(">H", props_len) + props


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (_item(21, 0, b"", 0, b""), "total smaller than a message head"),
        (_item(-1, 0, b"", 0, b""), "negative total"),
        (_item(100, 0, b"", 0, b""), "total past the end of the body"),
        (_item(24, -1, b"", 0, b"xx"), "negative body length"),
        (_item(24, 3, b"ab", 0, b""), "body length past the message's total"),
        (_item(24, 2, b"ab", 1, b""), "properties length that does not add up"),
        (_item(25, 2, b"ab", 0, b"x"), "properties length short of the total"),
        (_item(22, 0, b"", 0, b"") + b"\x00" * 5, "trailing bytes that are not a message"),
    ],
)
def test_decode_batch_refuses_inconsistent_sizes(body: bytes, why: str) -> None:
    with pytest.raises(HeaderError, match="batch"):
        decode_batch(body)


def test_decode_batch_refuses_more_messages_than_allowed() -> None:
    body = encode_batch_item(b"x", 0, b"") * 4
    assert len(decode_batch(body, max_messages=4)) == 4
    with pytest.raises(HeaderError, match="more than 3"):
        decode_batch(body, max_messages=3)


def test_decode_batch_on_random_bytes_raises_only_header_error(seed: int) -> None:
    rng = random.Random(seed)
    good = encode_batch_item(b"payload", 0, b"k\x01v\x02")
    for _ in range(2000):
        if rng.random() < 0.5:
            data = rng.randbytes(rng.randrange(0, 80))
        else:
            mutated = bytearray(good * rng.randrange(1, 3))
            for _ in range(rng.randrange(1, 4)):
                mutated[rng.randrange(len(mutated))] = rng.randrange(256)
            data = bytes(mutated)
        try:
            out = decode_batch(data)
        except HeaderError:
            continue
        assert sum(22 + len(b) + len(p) for _, b, p in out) == len(data)
