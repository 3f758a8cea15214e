"""The partition harness's pure parts (loadtest/partition): schedules from seeds, the gap and
tenure arithmetic of the checks, the targets, and the benchmark's totals — no sockets."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks.output import default_name
from benchmarks.partitions import totals
from loadtest.partition.checks import TENURE_TOLERANCE_S, Stored, longest_gap, tenure_violations
from loadtest.partition.cluster import NetPath
from loadtest.partition.monitor import Election, parse_history
from loadtest.partition.proxy import Mode
from loadtest.partition.recorder import Ack, Recorder
from loadtest.partition.run import availability_target, missed_targets, resume_target
from loadtest.partition.schedule import CUT_S, NAMED, Cut, Kill, random_schedule, single_cut

pytestmark = pytest.mark.unit


def recorder_with(times: list[float]) -> Recorder:
    r = Recorder("127.0.0.1:9876", lambda port: None, lambda addr: None)
    r._ack_times = list(times)
    return r


def ack(n: int, member: int) -> Ack:
    return Ack(n, f"id{n}", f"off{n}", b"b", member, 0.0, 0.0, 0.0, 0.0)


def test_a_seed_gives_the_same_schedule_and_the_named_cases_are_there() -> None:
    assert random_schedule(42) == random_schedule(42)
    assert {s.describe() for s in (random_schedule(i) for i in range(50))} != {random_schedule(0).describe()}
    for name in ("asymmetric-cp-cut", "cp-hold", "ha-hold", "client-hold", "cp-flap", "two-step", "kill-master"):
        assert name in NAMED
    assert NAMED["asymmetric-cp-cut"].steps[0].actions[0] == Cut(0.0, "master", NetPath.CONTROL_PLANE,
                                                                 Mode.HOLD_ANSWERS, CUT_S)  # fmt: skip
    for i in range(200):  # overlapping cuts never cut the same path of the same member twice
        for step in random_schedule(i).steps:
            cuts = [(a.who, a.path) for a in step.actions if isinstance(a, Cut)]
            assert len(cuts) == len(set(cuts))


def test_single_cuts_and_kills_carry_the_availability_target_and_only_cuts_the_resume_target() -> None:
    assert availability_target(single_cut("master", NetPath.CONTROL_PLANE, Mode.HOLD))
    assert availability_target(single_cut("slave", NetPath.HA, Mode.FLAP))
    assert availability_target(single_cut("master", NetPath.CLIENT, Mode.HOLD))
    assert not availability_target(NAMED["two-step"].steps[0])
    kill = NAMED["kill-master"].steps[0]
    assert isinstance(kill.actions[0], Kill)
    assert availability_target(kill)
    assert not resume_target(kill)
    assert resume_target(single_cut("master", NetPath.CLIENT, Mode.RESET))
    assert resume_target(NAMED["two-step"].steps[0])


def test_the_longest_gap_counts_from_the_cut_and_past_the_window() -> None:
    r = recorder_with([1.0, 2.0, 10.0, 10.1, 30.0])
    # cut at 1.5, healed at 6: 1.5 -> 2.0, then 2.0 -> 10.0 (began in the window)
    assert longest_gap(r, 1.5, 6.0, now=40.0) == pytest.approx(8.0)
    # a window with no SEND_OK at all: from the start to the next one
    assert longest_gap(r, 11.0, 12.0, now=40.0) == pytest.approx(19.0)
    # nothing after it either: until now
    assert longest_gap(r, 31.0, 32.0, now=40.0) == pytest.approx(9.0)
    assert r.first_ack_after(10.0) == 10.1
    assert r.first_ack_after(30.0) is None


def test_a_send_ok_outside_its_members_tenure_is_a_violation() -> None:
    history = [Election(1, 0, 100.0), Election(2, 1, 110.0), Election(3, 0, 120.0)]
    stored = {f"id{n}": Stored(b"b", ms) for n, ms in ((1, 105_000), (2, 115_000), (3, 125_000), (4, 112_000),
                                                       (5, 110_000 + int(TENURE_TOLERANCE_S * 500)))}  # fmt: skip
    acks = [ack(1, 0), ack(2, 1), ack(3, 0), ack(4, 0), ack(5, 0)]
    bad = tenure_violations(acks, stored, history)
    assert [v["n"] for v in bad] == [4]  # member 0 at 112 s: member 1's tenure
    assert bad[0]["tenure_then"] == {"epoch": 2, "master_id": 1}


def test_the_history_is_read_from_iso_timestamps() -> None:
    h = parse_history([{"epoch": 2, "master_id": 1, "elected_at": "2026-01-01T00:00:10+00:00"},
                       {"epoch": 1, "master_id": 0, "elected_at": "2026-01-01T00:00:00Z"}])  # fmt: skip
    assert h is not None
    assert [e.epoch for e in h] == [1, 2]
    assert h[1].elected_at - h[0].elected_at == 10.0
    assert parse_history(None) is None


def result(unavailable: float, heal: float, **verdict: Any) -> dict[str, Any]:
    v = {"settled": True, "lost": 0, "changed": 0, "overlapping_masters": 0, "converged": True, "acked": 10,
         "tenure_checked": True, **verdict}  # fmt: skip
    step = {"kind": "cp:hold:master", "availability_target": True, "unavailable_s": unavailable,
            "heal_to_send_ok_s": heal, "loop_stall_max_ms": None}  # fmt: skip
    return {"verdict": v, "steps": [step]}


def test_the_targets() -> None:
    assert missed_targets(result(9.0, 3.0), lease_s=6.0) == []
    missed = missed_targets(result(11.1, 3.5, lost=2), lease_s=6.0)
    assert any("11.1 s without a SEND_OK (target <= 9 s)" in m for m in missed)
    assert any("resumed 3.5 s after the heal" in m for m in missed)
    assert any("2 acknowledged messages lost" in m for m in missed)


def test_the_benchmark_totals() -> None:
    runs = [result(11.0, 1.0, acked=10), result(5.0, 0.5, acked=25, overlapping_masters=1)]
    t = totals(runs, lease_s=6.0)
    assert t["acked"] == 25
    assert t["overlapping_masters"] == 1
    assert t["lost"] == 0
    assert t["per_kind"]["cp:hold:master"]["unavailable_s"] == {"max": 11.0, "mean": 8.0, "count": 2}
    assert default_name("partitions").startswith("partitions-")
    assert default_name("partitions").endswith(".json")
