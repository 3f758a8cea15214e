"""sdk/pacer.py: after a broker's FLOW_CONTROL, the client's sends to it are spaced to the quota."""

from __future__ import annotations

import random

import pytest

from sdk.errors import FlowControlError
from sdk.pacer import DECREASE, DEFAULT_RATE, HEADROOM, IDLE_S, MIN_SHARE, Pacer

pytestmark = pytest.mark.unit

A = "127.0.0.1:10911"


def test_an_unrefused_broker_is_not_paced() -> None:
    p = Pacer()
    assert not p.paced(A)
    assert p.slot(A, 10.0, 13.0) == 0.0


def test_after_a_refusal_sends_take_slots_at_the_quotas_rate() -> None:
    p = Pacer(random.Random(1))
    p.refused(A, 10.0, 100, 1000.0)
    assert p.paced(A)
    first = p.slot(A, 10.0, 13.0)
    assert first is not None
    assert 0.1 <= first <= 0.11
    gaps = []
    prev = first
    for _ in range(10):
        w = p.slot(A, 10.0, 13.0)
        assert w is not None
        gaps.append(w - prev)
        prev = w
    # 1,000 msgs/s: a slot every 1/970 s (a little under the quota)
    assert all(g == pytest.approx(1 / (1000 * HEADROOM)) for g in gaps)
    batch = p.slot(A, 10.0, 13.0, msgs=32)
    assert batch is not None
    assert p.slot(A, 10.0, 13.0) == pytest.approx(batch + 32 / (1000 * HEADROOM))


def test_a_slot_past_the_deadline_is_refused_at_once_and_not_taken() -> None:
    p = Pacer(random.Random(2))
    p.refused(A, 10.0, 500, 10.0)
    assert p.slot(A, 10.0, 10.2) is None  # the first slot is 0.5 s away, the deadline 0.2 s
    w = p.slot(A, 10.0, 13.0)
    assert w is not None
    assert 0.5 <= w <= 0.55


def test_sends_already_on_their_way_when_the_pace_was_set_do_not_slow_it() -> None:
    p = Pacer(random.Random(6))
    p.refused(A, 1.0, 1, 1000.0, sent=0.9)
    for _ in range(15):  # the other sends of the burst the broker refused
        p.refused(A, 1.001, 1, 1000.0, sent=0.95)
    a, b = p.slot(A, 1.01, 9.0), p.slot(A, 1.01, 9.0)
    assert a is not None
    assert b is not None
    assert b - a == pytest.approx(1 / (1000 * HEADROOM))
    p.refused(A, 1.02, 1, 1000.0, sent=1.011)  # one sent under the pace: another client shares the quota
    c, d = p.slot(A, 1.03, 9.0), p.slot(A, 1.03, 9.0)
    assert c is not None
    assert d is not None
    assert d - c == pytest.approx(1 / (1000 * HEADROOM * DECREASE))


def test_refused_again_lowers_the_pace_down_to_a_floor_and_grants_win_it_back() -> None:
    p = Pacer(random.Random(3))
    p.refused(A, 0.0, 1, 1000.0)
    for i in range(10):
        p.refused(A, 0.001 * (i + 1), 1, 1000.0)
    w1 = p.slot(A, 0.0, 100.0)
    w2 = p.slot(A, 0.0, 100.0)
    assert w1 is not None
    assert w2 is not None
    assert w2 - w1 == pytest.approx(1 / (1000.0 * MIN_SHARE))  # never slower than the floor
    for _ in range(100):
        p.granted(A)
    w3 = p.slot(A, 0.0, 100.0)
    w4 = p.slot(A, 0.0, 100.0)
    assert w3 is not None
    assert w4 is not None
    assert w4 - w3 == pytest.approx(1 / (1000 * HEADROOM))  # back to the pace, not past it


def test_an_idle_pace_is_dropped() -> None:
    p = Pacer(random.Random(4))
    p.refused(A, 0.0, 10, 1000.0)
    assert p.slot(A, 0.0, 5.0) is not None
    assert p.slot(A, 0.02 + IDLE_S + 0.01, 9.0) == 0.0  # its slots fell a second behind
    assert not p.paced(A)


def test_a_refusal_without_a_rate_paces_at_the_default() -> None:
    p = Pacer(random.Random(5))
    p.refused(A, 0.0, 0, None)
    a, b = p.slot(A, 0.0, 5.0), p.slot(A, 0.0, 5.0)
    assert a is not None
    assert b is not None
    assert b - a == pytest.approx(1 / (DEFAULT_RATE * HEADROOM))


def test_the_flow_control_error_reads_the_brokers_rate_and_marks_the_clients_own() -> None:
    e = FlowControlError(remark="[TOO_MANY_REQUESTS] tenant 'a' ..., retry-after-ms=7, quota-msgs-per-s=250.5")
    assert (e.retry_after_ms, e.quota_msgs_per_s, e.local) == (7, 250.5, False)
    own = FlowControlError.held_back(A)
    assert own.local
    assert A in str(own)
    assert own.quota_msgs_per_s is None


def test_the_clients_of_one_credential_share_a_pacer() -> None:
    from sdk.client_instance import ClientInstance
    from sdk.credentials import AccessKeyCredentials

    creds = AccessKeyCredentials("ak-1", "secret")
    one = ClientInstance("127.0.0.1:9876", instance_name="a", credentials=creds)
    two = ClientInstance("127.0.0.1:9876", instance_name="b", credentials=AccessKeyCredentials("ak-1", "secret"))
    other = ClientInstance("127.0.0.1:9876", instance_name="c", credentials=AccessKeyCredentials("ak-2", "secret"))
    anonymous = ClientInstance("127.0.0.1:9876", instance_name="d")
    assert one.pacer is two.pacer
    assert other.pacer is not one.pacer
    assert anonymous.pacer is not ClientInstance("127.0.0.1:9876", instance_name="e").pacer
    one.pacer.refused(A, 0.0, 10, 100.0)
    assert two.pacer.paced(A)
    assert not other.pacer.paced(A)
