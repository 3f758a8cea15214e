"""The tier benchmark's pure parts (benchmarks/tier.py): checked bodies, the read check, the
cache's chunks a plain reader GETs, the backlog arithmetic, the phase order and the goals — no
processes."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks.tier import MIB, Bodies, ReadCheck, _chunks, _phase_order, _uploadable_bytes, goals

pytestmark = pytest.mark.unit


def test_a_body_carries_its_index_and_differs_from_its_neighbours() -> None:
    bodies = Bodies(seed=7, size=1024)
    assert len(bodies(0)) == len(bodies(123_456)) == 1024
    assert int.from_bytes(bodies(123_456)[:8], "big") == 123_456
    assert bodies(1)[8:] != bodies(2)[8:]
    assert Bodies(seed=7, size=1024)(99) == bodies(99)  # the seed replays them
    assert Bodies(seed=8, size=1024)(99) != bodies(99)


def test_the_read_check_counts_lost_changed_duplicated_and_unacknowledged_messages() -> None:
    bodies = Bodies(seed=1, size=64)
    acked = bytearray([1, 1, 1, 0, 1])
    check = ReadCheck(bodies, acked)
    for i in (0, 1, 1, 3):
        check.add(bodies(i))
    check.add(bodies(2)[:-1] + b"?")  # a changed byte
    check.add((99).to_bytes(8, "big") + bodies(0)[8:])  # an index nobody sent
    assert check.figures() == {"acked": 4, "lost": 2, "changed": 2, "duplicates": 1, "unacknowledged": 1}


def test_the_plain_reader_gets_the_chunks_the_cache_would_aligned_within_each_file() -> None:
    chunk = 4 * MIB
    objects = [(0, 10 * MIB, "a"), (10 * MIB, 9 * MIB, "b")]  # (from offset, size, key)
    got = _chunks(objects, 5 * MIB, 14 * MIB, chunk)
    assert got == [("a", 4 * MIB, 4 * MIB), ("a", 8 * MIB, 2 * MIB), ("b", 0, 4 * MIB)]
    assert _chunks(objects, 20 * MIB, 30 * MIB, chunk) == []


def test_the_backlog_is_what_sealed_files_hold_beyond_the_tier() -> None:
    file_bytes = 64 * MIB
    none_tiered = {"commitLogMaxOffset": str(5 * file_bytes + 7), "commitLogMinOffset": "0", "tier.tieredFiles": "0"}
    assert _uploadable_bytes(none_tiered, file_bytes) == 5 * file_bytes
    some = {**none_tiered, "tier.tieredFiles": "2", "tier.tierFromOffset": "0", "tier.tieredBytes": str(2 * file_bytes)}
    assert _uploadable_bytes(some, file_bytes) == 3 * file_bytes


def test_offload_phases_alternate_so_that_neither_kind_always_goes_first() -> None:
    assert [k for _, k in _phase_order(3)] == ["A", "B", "B", "A", "A", "B"]
    assert list(_phase_order(2, control=True)) == [(0, "A"), (0, "B"), (0, "C"), (1, "B"), (1, "A"), (1, "C")]


def result(*, p99_isolated: float | None, lost: int = 0, cold_ratio: float = 0.6) -> dict[str, Any]:
    read = {"hot": {"lost": 0, "changed": 0}, "cold": {"lost": lost, "changed": 0}, "cold_to_plain_ratio": cold_ratio}
    offload = {"colocated": {"p99_ratio": 3.0}}
    if p99_isolated is not None:
        offload["isolated"] = {"p99_ratio": p99_isolated}
    return {"read": read, "first_message": {"wrong": 0}, "offload": offload}


def test_goals_are_judged_each_with_its_figure() -> None:
    g = goals(result(p99_isolated=1.05))
    assert g["send_p99_offloading_to_not"] == {"goal": "<= 1.1", "value": 1.05, "met": True}
    assert g["send_p99_offloading_to_not_object_store_at_broker_priority"]["met"] is False
    assert g["cold_read_to_plain_reader"]["met"] is True
    assert g["lost_or_changed"] == {"goal": "0", "value": 0, "met": True}
    missed = goals(result(p99_isolated=None, lost=3, cold_ratio=0.4))
    assert "send_p99_offloading_to_not" not in missed
    assert missed["lost_or_changed"]["met"] is False
    assert missed["cold_read_to_plain_reader"]["met"] is False
