"""data_plane/broker/send_back.py and sdk/retry.py: the retry ladder's rules, the properties a
sent-back copy carries, the request the SDK sends, the retry-topic restore, and what a
dead-lettered message carries when it is sent again (no sockets)."""

from __future__ import annotations

import pytest

from data_plane.broker.send_back import (
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_RETRY_TOPIC,
    copy_properties,
    dlq_topic,
    goes_to_dlq,
    origin_topic,
    retry_delay_level,
    retry_topic,
)
from data_plane.remoting.codes import RequestCode
from data_plane.store.message import StoredMessage, encode_message_id, pack_host
from sdk import retry
from sdk.message import MessageExt


def stored(topic: str = "orders", reconsume: int = 0, **props: str) -> StoredMessage:
    return StoredMessage(
        total_size=200, body_crc=0, queue_id=1, flag=0, queue_offset=7, commit_log_offset=4096, sys_flag=0,
        born_timestamp=1, born_host=("10.0.0.1", 5000), store_timestamp=2, store_host=("10.0.0.2", 10911),
        reconsume_times=reconsume, prepared_transaction_offset=0, body=b"x", topic=topic, properties=dict(props),
    )  # fmt: skip


def received(topic: str, **props: str) -> MessageExt:
    return MessageExt(
        topic=topic, body=b"x", properties=dict(props), queue_id=0, queue_offset=3, broker_name="b",
        offset_msg_id="0A000002000027BF0000000000001000", commit_log_offset=4096, born_timestamp_ms=1,
        born_host=("10.0.0.1", 1), store_timestamp_ms=2, store_host=("10.0.0.2", 2), reconsume_times=2,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("reconsume", "requested", "level"),
    [(0, 0, 3), (1, 0, 4), (15, 0, 18), (30, 0, 18), (0, 5, 5), (4, 1, 1), (0, 99, 18)],
)
def test_the_retry_ladder_starts_at_level_3_and_follows_the_reconsume_count(
    reconsume: int, requested: int, level: int
) -> None:
    assert retry_delay_level(reconsume, requested) == level


def test_a_message_goes_to_the_dlq_when_out_of_retries_or_when_the_client_asks() -> None:
    assert not goes_to_dlq(0, 16, 0)
    assert not goes_to_dlq(15, 16, 3)
    assert goes_to_dlq(16, 16, 0)
    assert goes_to_dlq(0, 0, 0)
    assert goes_to_dlq(0, 16, -1)


def test_the_origin_of_a_retry_or_dlq_record_is_its_retry_topic_property_and_of_any_other_its_topic() -> None:
    # What a send-back's authorization checks besides the record's own topic (send_back._refused).
    assert origin_topic(stored("%RETRY%acme%g1", RETRY_TOPIC="acme%orders")) == "acme%orders"
    assert origin_topic(stored("%DLQ%acme%g1", RETRY_TOPIC="acme%orders")) == "acme%orders"
    assert origin_topic(stored("%RETRY%acme%g1")) == "%RETRY%acme%g1"
    assert origin_topic(stored("%DLQ%acme%g1", RETRY_TOPIC="")) == "%DLQ%acme%g1"
    # On a plain topic the property is whatever the sender wrote: the record's topic decides.
    assert origin_topic(stored("acme%orders", RETRY_TOPIC="acme%secret")) == "acme%orders"


def test_a_first_failure_records_the_original_topic_and_message_id() -> None:
    rec = stored(TAGS="t", UNIQ_KEY="U1", WAIT="true")
    props = copy_properties(rec, delay_level=3)
    assert props[PROPERTY_RETRY_TOPIC] == "orders"
    assert props[PROPERTY_ORIGIN_MESSAGE_ID] == encode_message_id(pack_host("10.0.0.2", 10911), 4096)
    assert props["DELAY"] == "3"
    assert props["TAGS"] == "t"
    assert props["UNIQ_KEY"] == "U1"
    assert "WAIT" not in props


def test_a_retried_copy_keeps_the_first_topic_and_id_and_a_dead_letter_has_no_delay() -> None:
    rec = stored("%RETRY%g", 3, RETRY_TOPIC="orders", ORIGIN_MESSAGE_ID="FIRST", DELAY="5", TRAN_MSG="true")
    props = copy_properties(rec, delay_level=None)
    assert props[PROPERTY_RETRY_TOPIC] == "orders"
    assert props[PROPERTY_ORIGIN_MESSAGE_ID] == "FIRST"
    assert "DELAY" not in props
    assert "TRAN_MSG" not in props


def test_topic_names_follow_rocketmq_and_keep_the_tenant() -> None:
    assert retry_topic("g") == "%RETRY%g" == retry.retry_topic("g")
    assert dlq_topic("acme%g") == "%DLQ%acme%g" == retry.dlq_topic("acme%g")


def test_the_sdk_request_names_the_delivered_copy_and_the_max() -> None:
    m = received("orders", UNIQ_KEY="U1")
    cmd = retry.send_back_request(m, "g", max_reconsume_times=16)
    assert cmd.code == RequestCode.CONSUMER_SEND_MSG_BACK
    assert cmd.ext_fields == {
        "offset": "4096",
        "group": "g",
        "delayLevel": "0",
        "originMsgId": "U1",
        "originTopic": "orders",
        "unitMode": "false",
        "maxReconsumeTimes": "16",
    }
    to_dlq = retry.send_back_request(m, "g", delay_level=-1, max_reconsume_times=3)
    assert (to_dlq.ext_fields or {})["delayLevel"] == "-1"


def test_a_message_from_the_retry_topic_gets_its_original_topic_back() -> None:
    from_retry = received("%RETRY%g", RETRY_TOPIC="orders")
    another_groups = received("%RETRY%other", RETRY_TOPIC="bills")
    plain = received("orders")
    retry.restore_retry_topics([from_retry, another_groups, plain], "%RETRY%g")
    assert (from_retry.topic, another_groups.topic, plain.topic) == ("orders", "%RETRY%other", "orders")


def test_a_resent_dead_letter_drops_its_old_delay_and_keeps_where_it_came_from() -> None:
    props = {"TAGS": "t", "UNIQ_KEY": "U1", "RETRY_TOPIC": "orders", "DELAY": "7", "REAL_TOPIC": "x",
             "REAL_QID": "0", "WAIT": "false", "user": "v"}  # fmt: skip
    out = retry.resend_properties(props, dlq_msg_id="DLQID")
    assert out == {"TAGS": "t", "UNIQ_KEY": "U1", "RETRY_TOPIC": "orders", "user": "v", "ORIGIN_MESSAGE_ID": "DLQID"}
    assert retry.resend_properties({"ORIGIN_MESSAGE_ID": "FIRST"}, dlq_msg_id="D")["ORIGIN_MESSAGE_ID"] == "FIRST"
    assert retry.original_topic(props, "%DLQ%g") == "orders"
    assert retry.original_topic({}, "%DLQ%g") == "%DLQ%g"


def test_a_dead_letter_is_named_by_any_of_its_ids() -> None:
    ids = {"unique_id": "AB01", "offset_msg_id": "0A00000200002", "origin_msg_id": "FF00"}
    assert retry.matches_id("ab01", **ids)
    assert retry.matches_id("0A00000200002", **ids)
    assert retry.matches_id("ff00", **ids)
    assert not retry.matches_id("0000", **ids)
    assert not retry.matches_id("AB01", unique_id=None, offset_msg_id="X", origin_msg_id=None)
