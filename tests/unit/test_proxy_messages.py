"""``data_plane.proxy.messages.to_properties``: the stored properties of a v2 message and the v5
rules that refuse one (each with its v2 status code)."""

from __future__ import annotations

from typing import Any

import pytest

from data_plane.proxy.messages import MessageRefused, to_message, to_properties
from data_plane.proxy.v2 import definition_pb2 as pb
from data_plane.store.message import StoredMessage

NOW_MS = 1_800_000_000_000


def message(**system: Any) -> pb.Message:
    m = pb.Message(topic=pb.Resource(name="t"), body=b"x")
    m.system_properties.message_id = "0123456789ABCDEF0123456789ABCDEF"
    for name, value in system.items():
        if name == "keys":
            m.system_properties.keys.extend(value)
        elif name == "delivery_ms":
            m.system_properties.delivery_timestamp.FromMilliseconds(value)
        else:
            setattr(m.system_properties, name, value)
    return m


def test_a_plain_message_carries_its_id_tag_and_declared_type() -> None:
    props, mtype = to_properties(message(tag="paid", message_type=pb.NORMAL), epoch_ms=NOW_MS)
    assert mtype == pb.NORMAL
    assert props == {"UNIQ_KEY": "0123456789ABCDEF0123456789ABCDEF", "TAGS": "paid", "V5_TYPE": str(pb.NORMAL)}


def test_a_message_with_no_type_is_a_normal_one() -> None:
    props, mtype = to_properties(message(), epoch_ms=NOW_MS)
    assert (mtype, props["V5_TYPE"]) == (pb.NORMAL, str(pb.NORMAL))


def test_user_properties_keys_and_trace_context_are_kept() -> None:
    m = message(keys=["k1", "k2"], trace_context="00-abc-def-01")
    m.user_properties["colour"] = "red"
    props, _ = to_properties(m, epoch_ms=NOW_MS)
    assert (props["colour"], props["KEYS"], props["traceparent"]) == ("red", "k1 k2", "00-abc-def-01")


def test_typed_messages_carry_their_group_time_or_prepared_mark() -> None:
    fifo, _ = to_properties(message(message_type=pb.FIFO, message_group="g1"), epoch_ms=NOW_MS)
    assert fifo["__SHARDINGKEY"] == "g1"
    delay, _ = to_properties(message(message_type=pb.DELAY, delivery_ms=NOW_MS + 5000), epoch_ms=NOW_MS)
    assert delay["TIMER_DELIVER_MS"] == str(NOW_MS + 5000)
    tx, _ = to_properties(message(message_type=pb.TRANSACTION), epoch_ms=NOW_MS)
    assert tx["TRAN_MSG"] == "true"


@pytest.mark.parametrize(
    ("system", "code"),
    [
        ({"message_id": ""}, pb.ILLEGAL_MESSAGE_ID),
        ({"tag": "a|b"}, pb.ILLEGAL_MESSAGE_TAG),
        ({"tag": ""}, pb.ILLEGAL_MESSAGE_TAG),
        ({"keys": ["has space"]}, pb.ILLEGAL_MESSAGE_KEY),
        ({"message_type": pb.FIFO}, pb.ILLEGAL_MESSAGE_GROUP),
        ({"message_type": pb.NORMAL, "message_group": "g"}, pb.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE),
        ({"message_group": "g"}, pb.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE),
        ({"message_type": pb.DELAY}, pb.ILLEGAL_DELIVERY_TIME),
        ({"delivery_ms": NOW_MS + 1000}, pb.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE),
        ({"message_type": pb.LITE}, pb.BAD_REQUEST),
        # A properties separator would end the stored property early and start one of the sender's.
        ({"message_id": "ID\x02DELAY\x013"}, pb.ILLEGAL_MESSAGE_ID),
        ({"keys": ["k\x02TRAN_MSG\x01true"]}, pb.ILLEGAL_MESSAGE_KEY),
        ({"trace_context": "00-\x01-01"}, pb.BAD_REQUEST),
        ({"message_type": pb.FIFO, "message_group": "g\x02x\x01y"}, pb.ILLEGAL_MESSAGE_GROUP),
    ],
)
def test_a_message_the_v5_rules_refuse_is_refused_with_its_code(system: dict[str, Any], code: int) -> None:
    with pytest.raises(MessageRefused) as e:
        to_properties(message(**system), epoch_ms=NOW_MS)
    assert e.value.code == code


@pytest.mark.parametrize(
    ("key", "value", "code"),
    [
        ("UNIQ_KEY", "forged", pb.ILLEGAL_MESSAGE_PROPERTY_KEY),  # a system property's name
        ("colour", "red\x02REAL_TOPIC\x01other", pb.BAD_REQUEST),  # a separator in the value
    ],
)
def test_a_user_property_the_v5_rules_refuse_is_refused_with_its_code(key: str, value: str, code: int) -> None:
    m = message()
    m.user_properties[key] = value
    with pytest.raises(MessageRefused) as e:
        to_properties(m, epoch_ms=NOW_MS)
    assert e.value.code == code
    assert key in str(e.value)


def test_a_stored_trace_context_is_read_back_in_its_own_field_only() -> None:
    props, _ = to_properties(message(trace_context="00-abc-def-01"), epoch_ms=NOW_MS)
    props["colour"] = "red"
    stored = StoredMessage(
        total_size=200, body_crc=0, queue_id=1, flag=0, queue_offset=7, commit_log_offset=4096, sys_flag=0,
        born_timestamp=1, born_host=("10.0.0.1", 5000), store_timestamp=2, store_host=("10.0.0.2", 10911),
        reconsume_times=0, prepared_transaction_offset=0, body=b"x", topic="t", properties=props,
    )  # fmt: skip
    back = to_message(stored)
    assert back.system_properties.trace_context == "00-abc-def-01"
    assert dict(back.user_properties) == {"colour": "red"}
