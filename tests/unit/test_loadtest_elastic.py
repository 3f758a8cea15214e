"""The ramp scenario's pure parts: the rate profile, the scenario's checks, exact lost and
duplicated counts, and the verdicts on hand-made samples."""

from __future__ import annotations

import re
from typing import Any

import pytest

from loadtest import scenario as sc
from loadtest.delivery import Tally, summary
from loadtest.elastic_verdict import grow_delays, verdicts
from loadtest.rate import RateProfile

pytestmark = pytest.mark.unit

RAMP = {"to": 4000, "over_s": 10, "hold_s": 5, "fall_to": 500, "fall_s": 5}


def judge(case: sc.Case, queues: list[dict[str, Any]], *, out_of_order: int | None = None) -> dict[str, Any]:
    """The verdicts of a run of RAMP (after 1 s at 1,000 msgs/s) with these queue samples, nothing
    lost, and no latency windows."""
    profile = RateProfile.ramp(start_msgs_per_s=1000, lead_s=1, to=4000, over_s=10, hold_s=5, fall_to=500, fall_s=5)
    return verdicts(
        case=case,
        profile=profile,
        queues=queues,
        acked_per_s={},
        windows=[],
        delivery={"lost": 0, "duplicated": 0},
        out_of_order=out_of_order,
    )


def test_a_ramp_climbs_linearly_in_one_second_steps_then_holds_and_falls() -> None:
    p = RateProfile.ramp(start_msgs_per_s=1000, lead_s=2, to=4000, over_s=10, hold_s=5, fall_to=500, fall_s=5)
    assert p.duration_s == 22
    assert p.rate_at(1) == 1000
    assert p.rate_at(2.5) == pytest.approx(1150)  # the first step: the ramp's rate at its middle
    assert p.rate_at(11.5) == pytest.approx(3850)
    assert p.rate_at(14) == 4000
    assert p.rate_at(20) == 500
    assert p.count() == pytest.approx(2000 + 25_000 + 20_000 + 2_500, abs=20)
    assert p.count_between(12, 17) == pytest.approx(20_000)


def test_the_scenario_checks_the_ramp_and_the_elastic_case() -> None:
    case = sc.parse({"rate_msgs_per_s": 1000, "duration_s": 20, "ramp": RAMP, "autoscale": {}}).cases[0]
    assert case.ramp == sc.Ramp(4000, 10, 5, 500, 5)
    assert case.autoscale == sc.Autoscale()
    bad = [
        ({"rate_msgs_per_s": 1000, "duration_s": 30, "ramp": RAMP}, "over_s + hold_s + fall_s is 20 s"),
        ({"duration_s": 20, "ramp": RAMP}, "a ramp starts from a target rate"),
        ({"rate_msgs_per_s": 1, "duration_s": 20, "ramp": {**RAMP, "speed": 1}}, "ramp.speed: unknown field"),
        ({"rate_msgs_per_s": 1, "autoscale": {"interval_s": 0}}, "autoscale.interval_s: 0 is outside"),
        ({"rate_msgs_per_s": 1, "autoscale": {}, "topics": 2}, "one topic and one consumer group"),
    ]
    for doc, message in bad:
        with pytest.raises(sc.ScenarioError, match=re.escape(message)):
            sc.parse(doc)


def test_lost_and_duplicated_messages_are_counted_exactly_across_consumers() -> None:
    acked, first, second = Tally(), Tally(), Tally()
    for seq in range(1, 1001):
        acked.add((0, 0), seq)
    for seq in range(1, 600):
        first.add((0, 0), seq)
        first.deliveries += 1
    for seq in [*range(590, 998), 1005]:  # 590..599 twice; 998..1000 never; 1005 sent but not acknowledged
        second.add((0, 0), seq)
        second.deliveries += 1
    got = summary([acked.encode()], [first.encode(), second.encode()])
    assert got == {
        "acknowledged": 1000,
        "delivered_distinct": 998,
        "deliveries": 599 + 409,
        "lost": 3,
        "duplicated": 10,
        "stored_unacknowledged": 1,
    }


def test_growth_is_timed_from_the_need_to_the_sample_showing_more_queues() -> None:
    queues = [{"t_s": float(t), "writable": 4 + 4 * (t >= 12), "readable": 4 + 4 * (t >= 12)} for t in range(0, 40, 2)]
    rate = RateProfile.ramp(start_msgs_per_s=1000, lead_s=0, to=8000, over_s=20, hold_s=20, fall_to=500, fall_s=0)
    spells = grow_delays(queues, rate.rate_at, 1000, 40)
    assert spells[0]["writable"] == 4
    assert spells[0]["grew_at_s"] == 12
    assert spells[0]["delay_s"] == pytest.approx(12 - spells[0]["need_at_s"])
    assert spells[-1]["grew_at_s"] is None  # past 6,400 msgs/s 8 queues are not enough: never grown


def test_a_case_whose_queues_never_come_back_misses_that_target_with_what_was_measured() -> None:
    case = sc.parse({"rate_msgs_per_s": 1000, "duration_s": 20, "ramp": RAMP, "autoscale": {}}).cases[0]
    queues = [{"t_s": float(t), "writable": 4 if t < 5 else 12, "readable": 4 if t < 5 else 12} for t in range(21)]
    got = judge(case, queues)
    assert not got["back_to_minimum"]["met"]
    assert got["back_to_minimum"]["measured"] == "not by the end of the run (5 s after the fall)"
    assert got["lost"]["met"]
    assert not got["send_p99"]["met"]
    assert not got["all_met"]


def test_queues_are_back_at_the_minimum_only_once_they_stay_there() -> None:
    case = sc.parse({"rate_msgs_per_s": 1000, "duration_s": 20, "ramp": RAMP, "autoscale": {}}).cases[0]
    counts = [4, 4, 8, 8, 4, 4, 4, *[12] * 11, 4, 4, 4]  # at the minimum before the fall, then not
    queues = [{"t_s": float(t), "writable": n, "readable": n} for t, n in enumerate(counts)]
    got = judge(case, queues)
    assert got["back_to_minimum"]["fall_at_s"] == 16
    assert got["back_to_minimum"]["measured"] == 2  # at 18 s, not at the 4 queues of 4-6 s
    assert got["back_to_minimum"]["met"]


def test_an_ordered_case_is_judged_on_order_and_loss_not_on_growth() -> None:
    doc = {"rate_msgs_per_s": 1000, "duration_s": 20, "ramp": RAMP, "autoscale": {}, "ordered": True}
    case = sc.parse(doc).cases[0]
    got = judge(case, [{"t_s": float(t), "writable": 4, "readable": 4} for t in range(21)], out_of_order=2)
    assert got["queues_grow"]["met"] is None
    assert got["back_to_minimum"]["met"] is None
    assert got["out_of_order"]["met"] is False
    assert got["out_of_order"]["measured"] == 2
    assert not got["all_met"]
