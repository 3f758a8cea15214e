"""The SDK's requests and response parsing (sdk/protocol.py, sdk/route.py, sdk/subscription.py,
sdk/errors.py), fed bytes directly: no sockets."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable

import orjson
import pytest

from data_plane.remoting import bodies
from data_plane.remoting.codes import FLAG_RESPONSE, RequestCode, ResponseCode
from data_plane.remoting.command import RemotingCommand, decode_frame, encode_bytes
from data_plane.remoting.errors import (
    RemotingConnectError,
    RemotingTimeoutError,
    RemotingTooMuchRequestError,
)
from data_plane.store import Message as StoreMessage
from data_plane.store import MessageStore, PutMessageStatus
from data_plane.store.message import decode_properties, pack_host, tags_hash_code
from sdk import errors, protocol
from sdk.message import Message, MessageQueue, SendResult, SendStatus
from sdk.protocol import PullStatus
from sdk.route import parse_route
from sdk.subscription import parse_subscription

MQ = MessageQueue("Orders", "broker-a", 2)


def _response(
    code: int, ext: dict[str, str] | None = None, body: bytes | None = None, remark: str = ""
) -> RemotingCommand:
    """A response as it arrives: encoded to a frame and decoded again."""
    cmd = RemotingCommand(code, flag=FLAG_RESPONSE, ext_fields=ext, body=body, remark=remark or None)
    return decode_frame(encode_bytes(cmd)[4:])


# --- send ---------------------------------------------------------------------------------------------
def test_send_request_has_rocketmqs_short_header_fields_as_strings() -> None:
    msg = Message("Orders", b"hello", tags="paid", keys="k1", properties={"p": "v"})
    cmd = protocol.send_request(group="G", msg=msg, queue_id=2, unique_id="U" * 32, born_timestamp_ms=1234)
    assert cmd.code == 310
    ext = cmd.ext_fields or {}
    assert {k: ext[k] for k in "abcdefghjkm"} == {
        "a": "G",
        "b": "Orders",
        "c": "TBW102",
        "d": "4",
        "e": "2",
        "f": "0",
        "g": "1234",
        "h": "0",
        "j": "0",
        "k": "false",
        "m": "false",
    }
    assert decode_properties(ext["i"]) == {"p": "v", "KEYS": "k1", "TAGS": "paid", "WAIT": "true", "UNIQ_KEY": "U" * 32}
    assert cmd.body == b"hello"
    assert all(isinstance(v, str) for v in ext.values())


@pytest.mark.parametrize("queue_id", [0, 7, 1023, 1024, 70_000])
@pytest.mark.parametrize(
    "msg",
    [
        Message("Orders", b"x"),
        Message("Orders", b"x", tags="paid"),
        Message("Orders", b"x", tags="paid", keys=["k1", "k2"], properties={"p": "v"}),
        Message("Orders", b"x", delay_level=3),
        Message("Orders", b"x", tags="paid", properties={"b": "2", "a": '1 "q" é'}),
        Message("Orders", b"x", properties={"only": ""}),
    ],
)
def test_send_request_header_is_the_one_send_header_makes(msg: Message, queue_id: int) -> None:
    """send_request builds its header inline (the send path); _send_header is the reference."""
    cmd = protocol.send_request(group="G", msg=msg, queue_id=queue_id, unique_id="U" * 32, born_timestamp_ms=99)
    want = protocol._send_header(
        group="G", topic=msg.topic, queue_id=queue_id, properties=msg.encoded_properties("U" * 32),
        born_timestamp_ms=99, batch=False,
    )  # fmt: skip
    assert cmd.ext_fields == want
    assert list(cmd.ext_fields or {}) == list(want)  # the same order on the wire
    assert msg.properties_text("U" * 32).encode() == msg.encoded_properties("U" * 32)


def test_batch_request_body_decodes_into_each_message_with_its_own_properties() -> None:
    msgs = [Message("Orders", b"one", tags="a"), Message("Orders", b"two", keys="k")]
    cmd = protocol.send_batch_request(
        group="G", msgs=msgs, queue_id=1, unique_ids=["A" * 32, "B" * 32], born_timestamp_ms=5
    )
    assert cmd.code == 320
    assert (cmd.ext_fields or {})["m"] == "true"
    items = bodies.decode_batch(cmd.body_bytes())
    assert [(body, decode_properties(p)["UNIQ_KEY"]) for _, body, p in items] == [
        (b"one", "A" * 32),
        (b"two", "B" * 32),
    ]
    assert decode_properties(items[0][2])["TAGS"] == "a"
    assert decode_properties(items[1][2])["KEYS"] == "k"


@pytest.mark.parametrize(
    ("code", "status"),
    [
        (ResponseCode.SUCCESS, SendStatus.SEND_OK),
        (ResponseCode.FLUSH_DISK_TIMEOUT, SendStatus.FLUSH_DISK_TIMEOUT),
        (ResponseCode.FLUSH_SLAVE_TIMEOUT, SendStatus.FLUSH_SLAVE_TIMEOUT),
        (ResponseCode.SLAVE_NOT_AVAILABLE, SendStatus.SLAVE_NOT_AVAILABLE),
    ],
)
def test_stored_but_not_durable_answers_are_statuses_not_errors(code: int, status: SendStatus) -> None:
    resp = _response(code, {"msgId": "7F000001000027110000000000000000", "queueId": "2", "queueOffset": "17"})
    result = protocol.parse_send_response(resp, MQ, "U" * 32)
    assert result.status is status
    assert (result.msg_id, result.offset_msg_id, result.queue_offset) == (
        "U" * 32,
        "7F000001000027110000000000000000",
        17,
    )
    assert result.message_queue == MQ


def test_a_send_result_is_the_frozen_dataclass_whichever_way_it_is_made() -> None:
    resp = _response(ResponseCode.SUCCESS, {"msgId": "OFFSET-ID", "queueId": "2", "queueOffset": "17"})
    result = protocol.parse_send_response(resp, MQ, "U" * 32)
    assert result == SendResult(SendStatus.SEND_OK, "U" * 32, "OFFSET-ID", MQ, 17)
    assert hash(result) == hash(SendResult(SendStatus.SEND_OK, "U" * 32, "OFFSET-ID", MQ, 17))
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.queue_offset = 18  # type: ignore[misc]
    # The broker names another queue than the one asked (a queue id it chose itself): that one.
    moved = protocol.parse_send_response(
        _response(ResponseCode.SUCCESS, {"msgId": "X", "queueId": "5", "queueOffset": "0"}), MQ, "U"
    )
    assert moved.message_queue == MessageQueue("Orders", "broker-a", 5)


@pytest.mark.parametrize(
    ("code", "cls", "retriable"),
    [
        (ResponseCode.SYSTEM_ERROR, errors.BrokerSystemError, True),
        (ResponseCode.SYSTEM_BUSY, errors.SystemBusyError, True),
        (ResponseCode.MESSAGE_ILLEGAL, errors.IllegalMessageError, False),
        (ResponseCode.SERVICE_NOT_AVAILABLE, errors.ServiceNotAvailableError, True),
        (ResponseCode.NO_PERMISSION, errors.NoPermissionError, False),
        (ResponseCode.TOPIC_NOT_EXIST, errors.TopicNotExistError, True),
        (ResponseCode.SUBSCRIPTION_NOT_LATEST, errors.SubscriptionNotLatestError, True),
    ],
)
def test_failure_codes_raise_the_class_of_their_code_with_code_and_remark(
    code: int, cls: type[errors.OrbitError], retriable: bool
) -> None:
    with pytest.raises(cls) as info:
        protocol.parse_send_response(_response(code, remark="why not"), MQ, "U", addr="10.0.0.1:10911")
    e = info.value
    assert isinstance(e, errors.OrbitError)
    assert (e.code, e.remark, e.addr, e.retriable) == (code, "why not", "10.0.0.1:10911", retriable)
    assert "why not" in str(e)


def test_an_unknown_failure_code_keeps_its_number() -> None:
    e = errors.for_code(777, "strange")
    assert isinstance(e, errors.UnknownBrokerError)
    assert (e.code, e.remark, e.retriable) == (777, "strange", False)


def test_the_code_table_maps_each_classs_code_back_to_it() -> None:
    assert errors.CODE_TO_ERROR[17] is errors.TopicNotExistError
    for code, cls in errors.CODE_TO_ERROR.items():
        assert cls.code == code
        assert type(errors.for_code(code)) is cls


def test_transport_failures_become_sdk_errors() -> None:
    timeout = errors.from_remoting(RemotingTimeoutError("h:1", 11, 500))
    assert isinstance(timeout, errors.RequestTimeoutError)
    assert isinstance(timeout, asyncio.TimeoutError), "a timeout is also asyncio's TimeoutError"
    assert timeout.retriable
    assert isinstance(errors.from_remoting(RemotingConnectError("h:1", "refused")), errors.ConnectionFailedError)
    assert isinstance(errors.from_remoting(RemotingTooMuchRequestError("busy")), errors.TooManyRequestsError)


# --- pull -------------------------------------------------------------------------------------------
def test_pull_request_sets_the_sys_flag_bits_it_uses() -> None:
    cmd = protocol.pull_request(
        group="G", mq=MQ, offset=9, max_nums=32, subscription="A || B", sub_version=77,
        suspend_timeout_ms=15000, commit_offset=5,
    )  # fmt: skip
    ext = cmd.ext_fields or {}
    assert cmd.code == 11
    assert int(ext["sysFlag"]) == 0x1 | 0x2 | 0x4, "commit offset, suspend, subscription"
    assert ext == {
        "consumerGroup": "G",
        "topic": "Orders",
        "queueId": "2",
        "queueOffset": "9",
        "maxMsgNums": "32",
        "sysFlag": "7",
        "commitOffset": "5",
        "suspendTimeoutMillis": "15000",
        "subscription": "A || B",
        "subVersion": "77",
        "expressionType": "TAG",
    }
    plain = protocol.pull_request(
        group="G", mq=MQ, offset=0, max_nums=1, subscription="*", sub_version=0, suspend_timeout_ms=0, suspend=False
    )
    assert (plain.ext_fields or {})["sysFlag"] == "4", "no commit offset, no suspend"


def _pull_body(make_store: Callable[..., MessageStore], n: int) -> bytes:
    """A PULL body as the broker ships it: the queue's records, back to back."""
    store = make_store(store_host="10.1.2.3", store_port=10911)
    for i in range(n):
        props = {"TAGS": f"tag{i % 2}", "KEYS": f"key-{i} extra", "UNIQ_KEY": f"{i:032X}", "user": "é"}
        result, _ = store.append(
            [StoreMessage(topic="Orders", body=f"body-{i}".encode(), queue_id=2, properties=props,
                          born_timestamp=1000 + i, born_host=pack_host("10.9.9.9", 4321))]
        )  # fmt: skip
        assert result.status is PutMessageStatus.PUT_OK
    got = store.get_message("Orders", 2, 0, 32)
    return b"".join(bytes(m) for m in got.messages)


def test_a_pull_body_of_store_records_decodes_into_messages(make_store: Callable[..., MessageStore]) -> None:
    body = _pull_body(make_store, 5)
    resp = _response(
        ResponseCode.SUCCESS,
        {"nextBeginOffset": "5", "minOffset": "0", "maxOffset": "5", "suggestWhichBrokerId": "0"},
        body,
    )
    result = protocol.parse_pull_response(resp, "broker-a")
    assert result.status is PullStatus.FOUND
    assert (result.next_begin_offset, result.min_offset, result.max_offset) == (5, 0, 5)
    msgs = result.messages
    assert [m.queue_offset for m in msgs] == [0, 1, 2, 3, 4]
    assert [m.body for m in msgs] == [f"body-{i}".encode() for i in range(5)]
    assert [m.tags for m in msgs] == ["tag0", "tag1", "tag0", "tag1", "tag0"]
    assert msgs[3].keys == ("key-3", "extra")
    assert msgs[3].msg_id == f"{3:032X}"
    assert msgs[3].properties["user"] == "é"
    assert all(m.broker_name == "broker-a" and m.topic == "Orders" and m.queue_id == 2 for m in msgs)
    assert msgs[0].store_host == ("10.1.2.3", 10911)
    assert msgs[0].born_host == ("10.9.9.9", 4321)
    assert msgs[4].born_timestamp_ms == 1004
    assert msgs[1].commit_log_offset == msgs[0].commit_log_offset + msgs[0].store_size
    assert msgs[0].offset_msg_id.startswith("0A01020300002A9F")


def test_a_corrupt_pull_body_is_a_broker_error(make_store: Callable[..., MessageStore]) -> None:
    body = _pull_body(make_store, 2)
    bad = bytearray(body)
    bad[90] ^= 0xFF  # inside the first body (88-byte header, then the body): its CRC no longer matches
    resp = _response(ResponseCode.SUCCESS, {"nextBeginOffset": "2", "minOffset": "0", "maxOffset": "2"}, bytes(bad))
    with pytest.raises(errors.BrokerError, match=r"record at byte 0.*CRC"):
        protocol.parse_pull_response(resp, "b")
    truncated = _response(ResponseCode.SUCCESS, {"nextBeginOffset": "2", "minOffset": "0", "maxOffset": "2"}, body[:-3])
    with pytest.raises(errors.BrokerError, match="not sound"):
        protocol.parse_pull_response(truncated, "b")


@pytest.mark.parametrize(
    ("code", "status"),
    [
        (ResponseCode.PULL_NOT_FOUND, PullStatus.NO_NEW_MSG),
        (ResponseCode.PULL_RETRY_IMMEDIATELY, PullStatus.NO_MATCHED_MSG),
        (ResponseCode.PULL_OFFSET_MOVED, PullStatus.OFFSET_ILLEGAL),
    ],
)
def test_pull_statuses_without_messages(code: int, status: PullStatus) -> None:
    resp = _response(code, {"nextBeginOffset": "12", "minOffset": "3", "maxOffset": "12", "suggestWhichBrokerId": "1"})
    result = protocol.parse_pull_response(resp, "b")
    assert (result.status, result.next_begin_offset, result.suggest_which_broker_id, result.messages) == (
        status,
        12,
        1,
        [],
    )


def test_a_pull_answer_without_next_begin_offset_is_an_error() -> None:
    with pytest.raises(errors.BrokerError, match="nextBeginOffset"):
        protocol.parse_pull_response(_response(ResponseCode.PULL_NOT_FOUND, {"minOffset": "0", "maxOffset": "0"}), "b")
    with pytest.raises(errors.SubscriptionParseFailedError):
        protocol.parse_pull_response(_response(ResponseCode.SUBSCRIPTION_PARSE_FAILED), "b")


# --- offsets, groups, locks -------------------------------------------------------------------------------
def test_query_offset_not_found_means_no_offset_yet() -> None:
    assert protocol.parse_query_offset_response(_response(ResponseCode.QUERY_NOT_FOUND)) is None
    assert protocol.parse_query_offset_response(_response(ResponseCode.SUCCESS, {"offset": "42"})) == 42
    cmd = protocol.update_offset_request("G", MQ, 43)
    assert (cmd.code, cmd.ext_fields) == (
        RequestCode.UPDATE_CONSUMER_OFFSET,
        {"consumerGroup": "G", "topic": "Orders", "queueId": "2", "commitOffset": "43"},
    )


def test_consumer_list_and_lock_bodies() -> None:
    ids = protocol.parse_consumer_list_response(
        _response(ResponseCode.SUCCESS, body=orjson.dumps({"consumerIdList": ["b@1#x", "a@2#y"]}))
    )
    assert ids == ["b@1#x", "a@2#y"]
    lock = protocol.lock_batch_request("G", "cid", [MQ])
    assert lock.code == RequestCode.LOCK_BATCH_MQ
    assert orjson.loads(lock.body_bytes()) == {
        "consumerGroup": "G",
        "clientId": "cid",
        "mqSet": [{"topic": "Orders", "brokerName": "broker-a", "queueId": 2}],
    }
    assert protocol.lock_batch_request("G", "cid", [MQ], unlock=True).code == RequestCode.UNLOCK_BATCH_MQ
    answer = _response(
        ResponseCode.SUCCESS, body=b'{"lockOKMQSet":[{"topic":"Orders","brokerName":"broker-a","queueId":2}]}'
    )
    assert protocol.parse_lock_batch_response(answer) == {MQ}


# --- routes ------------------------------------------------------------------------------------------------
def test_route_gives_write_queues_of_writable_brokers_with_a_master_and_read_queues_of_readable_ones() -> None:
    data = {
        "queueDatas": [
            {"brokerName": "b", "readQueueNums": 2, "writeQueueNums": 3, "perm": 6, "topicSynFlag": 0},
            {"brokerName": "a", "readQueueNums": 1, "writeQueueNums": 1, "perm": 4, "topicSynFlag": 0},  # read only
            {"brokerName": "c", "readQueueNums": 1, "writeQueueNums": 1, "perm": 2, "topicSynFlag": 0},  # write only
            {"brokerName": "d", "readQueueNums": 1, "writeQueueNums": 1, "perm": 6, "topicSynFlag": 0},  # no master
        ],
        "brokerDatas": [
            {"cluster": "x", "brokerName": "b", "brokerAddrs": {"0": "10.0.0.2:10911", "1": "10.0.0.3:10911"}},
            {"cluster": "x", "brokerName": "a", "brokerAddrs": {"0": "10.0.0.1:10911"}},
            {"cluster": "x", "brokerName": "c", "brokerAddrs": {"0": "10.0.0.4:10911"}},
            {"cluster": "x", "brokerName": "d", "brokerAddrs": {"1": "10.0.0.5:10911"}},
        ],
    }
    route = parse_route("T", data)
    assert [(q.broker_name, q.queue_id) for q in route.publish_queues] == [("b", 0), ("b", 1), ("b", 2), ("c", 0)]
    assert [(q.broker_name, q.queue_id) for q in route.subscribe_queues] == [("a", 0), ("b", 0), ("b", 1), ("d", 0)]
    assert route.master_addr("b") == "10.0.0.2:10911"
    assert route.master_addr("d") is None
    assert route.broker_addrs["b"][1] == "10.0.0.3:10911"
    capped = parse_route("T", data, max_write_queues=2)
    assert [(q.broker_name, q.queue_id) for q in capped.publish_queues] == [("b", 0), ("b", 1), ("c", 0)]


def test_route_body_written_by_fastjson_with_bare_numeric_keys_is_read() -> None:
    raw = (
        b'{"brokerDatas":[{"brokerAddrs":{0:"10.0.0.1:10911"},"brokerName":"a","cluster":"c"}],'
        b'"queueDatas":[{"brokerName":"a","perm":6,"readQueueNums":2,"topicSynFlag":0,"writeQueueNums":2}]}'
    )
    data = protocol.parse_route_response(_response(ResponseCode.SUCCESS, body=raw))
    assert data is not None
    assert parse_route("T", data).master_addr("a") == "10.0.0.1:10911"
    assert protocol.parse_route_response(_response(ResponseCode.TOPIC_NOT_EXIST)) is None


# --- subscriptions -------------------------------------------------------------------------------------------
def test_subscription_expressions() -> None:
    assert parse_subscription("T", "*").tags == ()
    assert parse_subscription("T", "").expression == "*"
    sub = parse_subscription("T", " TagA ||TagB|| TagA ", version=99)
    assert (sub.tags, sub.expression) == (("TagA", "TagB"), "TagA || TagB")
    assert sub.codes == (tags_hash_code("TagA"), tags_hash_code("TagB"))
    assert sub.to_wire() == {
        "classFilterMode": False,
        "topic": "T",
        "subString": "TagA || TagB",
        "tagsSet": ["TagA", "TagB"],
        "codeSet": [tags_hash_code("TagA"), tags_hash_code("TagB")],
        "subVersion": 99,
        "expressionType": "TAG",
    }
    for bad in ("||", "* || A"):
        with pytest.raises(errors.IllegalArgumentError):
            parse_subscription("T", bad)
    with pytest.raises(errors.IllegalArgumentError):
        parse_subscription("bad topic", "*")


def test_the_client_rechecks_tags_exactly() -> None:
    sub = parse_subscription("T", "TagA || TagB")
    assert sub.matches("TagA")
    assert sub.matches("TagB")
    assert not sub.matches("TagC")
    assert not sub.matches(None), "a message without a tag does not match a tag filter"
    assert not sub.matches("taga")
    everything = parse_subscription("T", "*")
    assert everything.matches(None)
    assert everything.matches("anything")
