"""The SDK's delayed and timed messages: ``Message(delay_level=…)`` and ``deliver_at_ms=…`` set
RocketMQ's DELAY and TIMER_DELIVER_MS properties (sdk/message.py)."""

from __future__ import annotations

import pytest

from sdk import Message
from sdk.errors import IllegalMessageError


def test_delay_level_and_delivery_time_become_properties() -> None:
    m = Message("T", b"x", delay_level=3)
    assert m.wire_properties("ID")["DELAY"] == "3"
    assert "TIMER_DELIVER_MS" not in m.wire_properties("ID")
    m = Message("T", b"x", deliver_at_ms=1_700_000_000_000)
    assert m.wire_properties("ID")["TIMER_DELIVER_MS"] == "1700000000000"
    assert "DELAY" not in m.wire_properties("ID")
    plain = Message("T", b"x").wire_properties("ID")
    assert "DELAY" not in plain
    assert "TIMER_DELIVER_MS" not in plain


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"delay_level": -1}, "delay_level"),
        ({"delay_level": True}, "delay_level"),
        ({"deliver_at_ms": -5}, "deliver_at_ms"),
        ({"deliver_at_ms": 1.5}, "deliver_at_ms"),
        ({"delay_level": 2, "deliver_at_ms": 10}, "not both"),
    ],
)
def test_bad_schedules_are_refused_where_the_message_is_built(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(IllegalMessageError, match=match):
        Message("T", b"x", **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["DELAY", "TIMER_DELIVER_MS", "TIMER_DELAY_SEC", "ORBIT_REPUT_FROM"])
def test_schedule_properties_are_reserved(name: str) -> None:
    with pytest.raises(IllegalMessageError, match="reserved"):
        Message("T", b"x", properties={name: "1"})
