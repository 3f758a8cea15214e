"""Partitions of a broker group's paths (loadtest/partition; docs/partitions.md): each named case
is a fixed schedule of cuts on one shared group with failover (default lease settings: 6 s,
checked every 1 s) under a steady load; the seeded run draws a schedule from a seed
(ORBIT_TEST_SEED replays one). After every schedule: every acknowledged message readable from
the master byte for byte, never two writable masters at once, the other member's log the
master's; and the targets — at most lease + 3 s without a SEND_OK during a single-path cut
(control plane, HA link or clients), writes back within 3 s of every heal, no event-loop stall
over 100 ms."""

from __future__ import annotations

import json

import pytest

from loadtest.partition.run import Harness, missed_targets, run_schedule
from loadtest.partition.schedule import NAMED, Schedule, random_schedule

pytestmark = [pytest.mark.partition, pytest.mark.timing, pytest.mark.asyncio(loop_scope="module")]


async def holds(harness: Harness, schedule: Schedule) -> None:
    result = await run_schedule(harness, schedule)
    print(json.dumps(result, indent=1))
    missed = missed_targets(result, lease_s=harness.cluster.options.lease_s)
    assert not missed, f"{schedule.describe()}\nmissed: " + "; ".join(missed)


async def test_an_asymmetric_control_plane_cut_of_the_master_stops_writes_no_longer_than_the_lease(
    harness: Harness,
) -> None:
    """Finding 1: the master's heartbeats reach the control plane, the answers do not come back."""
    await holds(harness, NAMED["asymmetric-cp-cut"])


async def test_a_master_cut_off_from_the_control_plane_stops_writes_no_longer_than_the_lease(
    harness: Harness,
) -> None:
    """Finding 2: the slave is promoted; the old master must learn to follow it."""
    await holds(harness, NAMED["cp-hold"])


async def test_a_held_replication_link_stops_writes_no_longer_than_the_lease(harness: Harness) -> None:
    await holds(harness, NAMED["ha-hold"])


async def test_a_master_clients_cannot_reach_steps_down_and_writes_stop_no_longer_than_the_lease(
    harness: Harness,
) -> None:
    """Its slave's probes of its client address fail too: the control plane asks it to step down."""
    await holds(harness, NAMED["client-hold"])


async def test_a_flapping_control_plane_path_keeps_one_writable_master(harness: Harness) -> None:
    await holds(harness, NAMED["cp-flap"])


async def test_a_two_step_cut_loses_no_acknowledged_message(harness: Harness) -> None:
    """Finding 4: a demoted member that never reached the new master stands in the next election
    with its longer log."""
    await holds(harness, NAMED["two-step"])


async def test_kill_9_of_the_master_loses_no_acknowledged_message(harness: Harness) -> None:
    await holds(harness, NAMED["kill-master"])


async def test_a_seeded_schedule(harness: Harness, seed: int) -> None:
    await holds(harness, random_schedule(seed, steps=(1, 1)))
