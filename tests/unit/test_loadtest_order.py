"""The ordered-case check consumers run: redeliveries are told apart from messages that came
after a later message of their key."""

from __future__ import annotations

import pytest

from loadtest.workers import HEADER, OrderCheck

pytestmark = pytest.mark.unit

K = ("g", 0, 3)


def test_in_order_with_redeliveries_is_not_out_of_order() -> None:
    c = OrderCheck()
    for seq in [1, 2, 3, 2, 3, 4, 5, 1]:
        c.see(K, seq)
    assert (c.out_of_order, c.redelivered) == (0, 3)


def test_a_message_after_a_later_one_of_its_key_is_out_of_order() -> None:
    c = OrderCheck()
    for seq in [1, 2, 4, 3, 5, 7, 6, 6]:
        c.see(K, seq)
    assert (c.out_of_order, c.redelivered) == (2, 1)


def test_keys_are_independent_and_a_key_may_start_anywhere() -> None:
    c = OrderCheck()
    for key, seq in [(K, 500), (("g", 1, 3), 1), (K, 501), (("g", 1, 3), 2), (("h", 0, 3), 9)]:
        c.see(key, seq)
    assert (c.out_of_order, c.redelivered) == (0, 0)


def test_a_queue_handed_over_and_back_is_not_tracked_as_holes() -> None:
    c = OrderCheck()
    c.see(K, 1)
    c.see(K, 1 + OrderCheck.MAX_GAP + 1)  # the other consumer had all of those
    c.see(K, 2)
    assert (c.out_of_order, c.redelivered) == (0, 1)


def test_the_body_header_is_24_bytes_of_time_producer_key_and_sequence() -> None:
    raw = HEADER.pack(1_700_000_000_123_456_789, 3, 7, 42)
    assert len(raw) == 24
    assert raw[:8] == (1_700_000_000_123_456_789).to_bytes(8, "big")
    assert HEADER.unpack_from(raw + b"pad") == (1_700_000_000_123_456_789, 3, 7, 42)
