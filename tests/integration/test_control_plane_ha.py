"""The failover leases over HTTP against a real PostgreSQL: the configured master takes the
first epoch, renews it, and after its lease runs out the most caught-up live member becomes
master under the next epoch; everyone else is told whom to follow; bad heartbeats are refused;
operators see it all in the fleet view."""

from __future__ import annotations

import asyncio
import secrets
import time
from typing import Any

import pytest

from tests.postgres_fixture import (  # noqa: F401
    ControlPlaneHarness,
    control_plane_fixture,
    postgres_dsn_fixture,
    postgres_server_fixture,
)

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

LEASE_S = 1.0


async def broker_token(cp: ControlPlaneHarness) -> str:
    made = await cp.call("POST", "/v1/admin/credentials", operator=True, json={"role": "broker"})
    assert made.status == 201, made.body
    return await cp.token_for(made.body["access_key"], made.body["secret"])


class Member:
    """One process of a group member as the control plane sees it: it names its instance and
    echoes the last answer it heard (``deaf``: its answers are lost on the way back)."""

    def __init__(self, cp: ControlPlaneHarness, token: str, member: int, *, group: str = "broker-x") -> None:
        self.cp, self.token, self.member, self.group = cp, token, member, group
        self.instance = secrets.token_hex(8)
        self.heard = 0
        self.deaf = False

    def restart(self) -> None:
        self.instance = secrets.token_hex(8)
        self.heard = 0

    async def call(self, max_offset: int, **extra: Any) -> Any:
        body = {
            "cluster": "c1", "broker_name": self.group, "member_id": self.member,
            "addr": f"127.0.0.1:{10911 + 10 * self.member}", "ha_addr": f"127.0.0.1:{10912 + 10 * self.member}",
            "max_offset": max_offset, "epoch": extra.pop("epoch", 0), "acting_master": False, "lease_s": LEASE_S,
            "instance": self.instance, "heard": self.heard, **extra,
        }  # fmt: skip
        return await self.cp.call("POST", "/internal/v1/ha/heartbeat", token=self.token, json=body)

    async def beat(self, max_offset: int, **extra: Any) -> dict[str, Any]:
        reply = await self.call(max_offset, **extra)
        assert reply.status == 200, reply.body
        if not self.deaf:
            self.heard = reply.body["seq"]
        return dict(reply.body)


async def fleet_group(cp: ControlPlaneHarness, name: str) -> dict[str, Any]:
    view = await cp.call("GET", "/v1/fleet/ha", operator=True)
    assert view.status == 200
    (group,) = [g for g in view.body["broker_groups"] if g["broker_name"] == name]
    return dict(group)


async def until_master(
    candidate: Member, max_offset: int, others: list[tuple[Member, int]], **extra: Any
) -> dict[str, Any]:
    """Beat ``candidate`` (and the others, each with its offset) until it is elected; fails
    after 30 lease periods."""
    for _ in range(120):
        one = await candidate.beat(max_offset, **extra)
        if one["role"] == "MASTER":
            return one
        for other, offset in others:
            assert (await other.beat(offset))["role"] == "SLAVE"
        await asyncio.sleep(LEASE_S / 4)
    raise AssertionError(f"member {candidate.member} was never elected")


async def test_election_renewal_and_failover(control_plane: ControlPlaneHarness) -> None:
    token = await broker_token(control_plane)
    m0, m1, m2 = (Member(control_plane, token, i) for i in range(3))
    # A slave heard first does not take a new group: it waits for the configured master.
    first = await m1.beat(0)
    assert (first["role"], first["master_addr"]) == ("SLAVE", "")
    m = await m0.beat(0, master_role="SYNC_MASTER")
    assert (m["role"], m["epoch"], m["master_role"]) == ("MASTER", 1, "SYNC_MASTER")
    assert m["lease_remaining_s"] == LEASE_S
    s = await m1.beat(100)
    assert (s["role"], s["epoch"], s["master_addr"], s["master_ha_addr"]) == (
        "SLAVE",
        1,
        "127.0.0.1:10911",
        "127.0.0.1:10912",
    )
    # Renewals keep the master; a slave that is further ahead does not steal it. (The master
    # renews for longer than the test's short lease here, so a stall of the host cannot end it.)
    # The master reports both slaves in sync.
    for _ in range(3):
        renewed = await m0.beat(500, epoch=1, master_role="SYNC_MASTER", lease_s=60, in_sync=[1, 2])
        assert renewed["role"] == "MASTER"
        assert (await m1.beat(100))["role"] == "SLAVE"
        assert (await m2.beat(900))["role"] == "SLAVE"
        await asyncio.sleep(LEASE_S / 3)
    assert (await fleet_group(control_plane, "broker-x"))["sync_set"] == [0, 1, 2]
    # Its last renewal is for LEASE_S; then the master goes quiet and the slaves go on (member 2
    # now behind member 1). Once the lease has run out, the live member furthest ahead (1) wins
    # the next epoch, never member 2.
    assert (await m0.beat(500, epoch=1, master_role="SYNC_MASTER"))["role"] == "MASTER"
    winner = await until_master(m1, 100, [(m2, 90)])
    assert winner["epoch"] == 2
    two = await m2.beat(90)
    assert (two["role"], two["epoch"], two["master_addr"]) == ("SLAVE", 2, "127.0.0.1:10921")
    # The old master comes back: told to follow the new one under the new epoch.
    old = await m0.beat(500, epoch=1, master_role="SYNC_MASTER")
    assert (old["role"], old["epoch"], old["master_addr"]) == ("SLAVE", 2, "127.0.0.1:10921")
    group = await fleet_group(control_plane, "broker-x")
    assert (group["epoch"], group["master_id"], group["sync_set"]) == (2, 1, [1])
    assert {m["member_id"] for m in group["members"]} == {0, 1, 2}
    assert [(h["epoch"], h["master_id"]) for h in group["history"]] == [(1, 0), (2, 1)]


async def test_a_master_that_does_not_hear_its_answers_loses_the_group(control_plane: ControlPlaneHarness) -> None:
    """The asymmetric cut: the master's heartbeats arrive, its answers never come back. It
    fences itself on its own clock, so renewing it would leave the group without a writer."""
    token = await broker_token(control_plane)
    m0, m1 = Member(control_plane, token, 0, group="broker-deaf"), Member(control_plane, token, 1, group="broker-deaf")
    assert (await m0.beat(0, master_role="SYNC_MASTER"))["role"] == "MASTER"
    assert (await m0.beat(1000, epoch=1, master_role="SYNC_MASTER", in_sync=[1]))["role"] == "MASTER"
    assert (await m1.beat(1000, epoch=1))["role"] == "SLAVE"
    m0.deaf = True
    began = time.monotonic()
    # The deaf master keeps calling, further ahead than the slave. Its answers still say MASTER
    # while the lease runs, with what is left of it: never renewed.
    winner = None
    remaining = []
    while winner is None and time.monotonic() - began < 30 * LEASE_S:
        deaf = await m0.beat(5000, epoch=1, log_epoch=1)
        if deaf["role"] == "MASTER":
            remaining.append(deaf["lease_remaining_s"])
        one = await m1.beat(1000, epoch=1, log_epoch=1)
        winner = one if one["role"] == "MASTER" else None
        await asyncio.sleep(LEASE_S / 8)
    took = time.monotonic() - began
    print(f"a hearing slave elected {took:.2f} s after its master stopped hearing (lease {LEASE_S} s)")
    assert winner is not None
    assert winner["epoch"] == 2
    assert remaining == sorted(remaining, reverse=True), remaining
    assert remaining[0] <= LEASE_S
    assert took < 3 * LEASE_S
    # The deaf member is never elected, however far ahead: it could not learn that it won. (Nor
    # is it while the new master lives on, as then no election is held.)
    m1_quiet_until = time.monotonic() + 3 * LEASE_S
    while time.monotonic() < m1_quiet_until:
        assert (await m0.beat(9000, epoch=1))["role"] == "SLAVE"
        assert (await m1.beat(1000, epoch=2, log_epoch=2))["role"] == "MASTER"
        await asyncio.sleep(LEASE_S / 4)
    # Hearing again, it is told to follow the new master.
    m0.deaf = False
    await m0.beat(9000, epoch=1)
    follow = await m0.beat(9000, epoch=1)
    assert (follow["role"], follow["epoch"], follow["master_addr"]) == ("SLAVE", 2, "127.0.0.1:10921")


async def test_only_in_sync_members_are_electable_and_the_newest_log_wins(control_plane: ControlPlaneHarness) -> None:
    """Epoch 1: master 0, slave 1 in sync, member 2 never caught up. Master 0 dies; 1 wins
    epoch 2 though 2 reports more bytes (its tail was never acknowledged). Then 1 dies before
    any slave joined its in-sync set: nobody else is electable until it returns. Candidates with
    logs of different epochs: the newer log wins over more bytes."""
    token = await broker_token(control_plane)
    name = "broker-sync"
    m0, m1, m2 = (Member(control_plane, token, i, group=name) for i in range(3))
    assert (await m0.beat(0, master_role="SYNC_MASTER"))["role"] == "MASTER"
    assert (await m0.beat(800, epoch=1, log_epoch=1, master_role="SYNC_MASTER", in_sync=[1]))["role"] == "MASTER"
    await m1.beat(800, epoch=1, log_epoch=1)
    await m2.beat(900, epoch=1, log_epoch=1)
    assert (await fleet_group(control_plane, name))["sync_set"] == [0, 1]
    won = await until_master(m1, 800, [(m2, 900)], epoch=1, log_epoch=1)
    assert won["epoch"] == 2
    # Member 1 (epoch 2, alone in its in-sync set) stops; 0 and 2 live on, neither electable.
    deadline = time.monotonic() + 4 * LEASE_S
    while time.monotonic() < deadline:
        for member, offset in ((m0, 5000), (m2, 900)):
            answer = await member.beat(offset, epoch=2, log_epoch=1)
            assert answer["role"] == "SLAVE", answer
        await asyncio.sleep(LEASE_S / 4)
    group = await fleet_group(control_plane, name)
    assert (group["epoch"], group["master_id"], group["sync_set"]) == (2, 1, [1])
    # It returns (the same process) and is elected again, epoch 3; it reports both in sync.
    back = await until_master(m1, 1200, [], epoch=2, log_epoch=2)
    assert back["epoch"] == 3
    assert (await m1.beat(1200, epoch=3, log_epoch=3, in_sync=[0, 2]))["role"] == "MASTER"
    # Now 1 dies again: 0 (log of epoch 1, 5000 bytes) and 2 (log of epoch 3, 1200 bytes):
    # the newer log wins.
    won = await until_master(m2, 1200, [(m0, 5000)], epoch=3, log_epoch=3)
    assert won["epoch"] == 4
    history = (await fleet_group(control_plane, name))["history"]
    assert [(h["epoch"], h["master_id"], h["log_epoch"]) for h in history] == [
        (1, 0, 0),
        (2, 1, 1),
        (3, 1, 2),
        (4, 2, 3),
    ]


async def test_a_lease_belongs_to_one_process(control_plane: ControlPlaneHarness) -> None:
    """A second process for a member heard from a moment ago is refused; a restarted process
    does not inherit its predecessor's lease: it is elected only once that lease ran out."""
    token = await broker_token(control_plane)
    name = "broker-proc"
    m0 = Member(control_plane, token, 0, group=name)
    assert (await m0.beat(0, master_role="SYNC_MASTER"))["role"] == "MASTER"
    twin = Member(control_plane, token, 0, group=name)
    refused = await twin.call(0, master_role="SYNC_MASTER")
    assert refused.status == 409, refused.body
    assert refused.body["error"]["code"] == "member_runs_elsewhere"
    assert "already runs as another process" in refused.body["error"]["message"]
    # The first process stops (kill -9) and comes back as a new one after two intervals.
    await asyncio.sleep(2.1)
    m0.restart()
    began = time.monotonic()
    answer = await m0.beat(100, epoch=1, log_epoch=1, master_role="SYNC_MASTER")
    if answer["role"] != "MASTER":  # not while its predecessor's lease runs
        assert answer["master_addr"] == ""
        answer = await until_master(m0, 100, [], epoch=1, log_epoch=1, master_role="SYNC_MASTER")
    assert answer["epoch"] == 2
    print(f"the restarted process was elected {time.monotonic() - began:.2f} s after its first heartbeat")


async def test_an_election_waits_a_moment_for_a_candidate_not_heard_since_the_lease_ran_out(
    control_plane: ControlPlaneHarness,
) -> None:
    token = await broker_token(control_plane)
    name = "broker-grace"
    lease = 3.0  # grace: min(lease / 2, 2 intervals) = 1.5 s
    m0, m1, m2 = (Member(control_plane, token, i, group=name) for i in range(3))
    assert (await m0.beat(0, master_role="SYNC_MASTER", lease_s=lease))["role"] == "MASTER"
    renewed = await m0.beat(100, epoch=1, log_epoch=1, master_role="SYNC_MASTER", in_sync=[1, 2], lease_s=lease)
    assert renewed["role"] == "MASTER"
    expires = time.monotonic() + lease
    await asyncio.sleep(lease - 1.0)
    await m1.beat(40, epoch=1, log_epoch=1, lease_s=lease)  # last heard before the lease runs out
    await m2.beat(50, epoch=1, log_epoch=1, lease_s=lease)
    await asyncio.sleep(max(0.0, expires - time.monotonic()) + 0.2)
    # Member 2 calls first: best on what it knows, but 1 has not reported since the lease ran out.
    assert (await m2.beat(50, epoch=1, log_epoch=1, lease_s=lease))["role"] == "SLAVE"
    # Member 1 reports: it had received more meanwhile, and wins.
    assert (await m1.beat(60, epoch=1, log_epoch=1, lease_s=lease))["role"] == "MASTER"


async def test_a_master_its_slaves_cannot_reach_steps_down_and_hands_over_at_once(
    control_plane: ControlPlaneHarness,
) -> None:
    """The master's client path is cut: its heartbeats and its slaves' heartbeats arrive, but the
    slaves' probes of its client address fail. It is asked to step down; once it heard that, the
    lease is released and a slave elected without waiting for the lease to run out. A member
    that still reaches the master vetoes."""
    token = await broker_token(control_plane)
    name = "broker-unreachable"
    m0, m1, m2 = (Member(control_plane, token, i, group=name) for i in range(3))
    long = 60.0  # a lease that never runs out in this test: only a step-down hands over
    assert (await m0.beat(0, master_role="SYNC_MASTER", lease_s=long))["role"] == "MASTER"
    assert (await m0.beat(10, epoch=1, log_epoch=1, in_sync=[1, 2], lease_s=long))["role"] == "MASTER"
    # Member 1 cannot reach it, member 2 can: no step-down.
    await m1.beat(10, epoch=1, log_epoch=1, master_unreachable_s=9.0, lease_s=long)
    await m2.beat(10, epoch=1, log_epoch=1, master_unreachable_s=0.0, lease_s=long)
    assert (await m0.beat(10, epoch=1, log_epoch=1, in_sync=[1, 2], lease_s=long))["role"] == "MASTER"
    # Under the threshold (2 intervals + 0.5 s) it stays too.
    await m2.beat(10, epoch=1, log_epoch=1, master_unreachable_s=2.4, lease_s=long)
    assert (await m0.beat(10, epoch=1, log_epoch=1, in_sync=[1, 2], lease_s=long))["role"] == "MASTER"
    # Neither reaches it: asked to step down (no master named), and not renewed.
    await m2.beat(10, epoch=1, log_epoch=1, master_unreachable_s=3.0, lease_s=long)
    down = await m0.beat(10, epoch=1, log_epoch=1, in_sync=[1, 2], lease_s=long)
    assert (down["role"], down["master_addr"]) == ("SLAVE", "")
    # Not yet heard: no one is elected.
    assert (await m1.beat(10, epoch=1, log_epoch=1, master_unreachable_s=4.0, lease_s=long))["role"] == "SLAVE"
    # It heard (its next heartbeat echoes that answer, reporting itself fenced): released; the
    # slave furthest ahead wins at once, though the old master reports more.
    # (Member 2 reports after the release too: else the election would give it a moment's grace.)
    await m0.beat(50, epoch=1, log_epoch=1, acting_master=False, lease_s=long)
    assert (await m2.beat(10, epoch=1, log_epoch=1, master_unreachable_s=4.5, lease_s=long))["role"] == "SLAVE"
    won = await m1.beat(10, epoch=1, log_epoch=1, master_unreachable_s=4.5, lease_s=long)
    assert (won["role"], won["epoch"]) == ("MASTER", 2)
    follow = await m0.beat(50, epoch=1, log_epoch=1, lease_s=long)
    assert (follow["role"], follow["epoch"], follow["master_addr"]) == ("SLAVE", 2, "127.0.0.1:10921")


async def test_no_step_down_without_a_successor_and_a_heartbeat_naming_no_process_is_heard(
    control_plane: ControlPlaneHarness,
) -> None:
    """A master alone in its in-sync set keeps the group though its slave cannot reach it (a
    step-down would elect nobody). A broker that names no process and echoes no answer is taken
    as hearing: it is renewed."""
    token = await broker_token(control_plane)
    name = "broker-alone"
    m0, m1 = Member(control_plane, token, 0, group=name), Member(control_plane, token, 1, group=name)
    assert (await m0.beat(0, master_role="SYNC_MASTER", lease_s=60))["role"] == "MASTER"
    assert (await m0.beat(10, epoch=1, log_epoch=1, in_sync=[], lease_s=60))["sync_set"] == [0]
    await m1.beat(5, epoch=1, log_epoch=1, master_unreachable_s=30.0, lease_s=60)
    kept = await m0.beat(10, epoch=1, log_epoch=1, in_sync=[], lease_s=60)
    assert (kept["role"], kept["lease_remaining_s"]) == ("MASTER", 60)
    body = {
        "cluster": "c1", "broker_name": "broker-legacy", "member_id": 0, "addr": "127.0.0.1:10911",
        "max_offset": 0, "epoch": 0, "master_role": "SYNC_MASTER", "lease_s": 60,
    }  # fmt: skip
    for epoch in (0, 1, 1):
        reply = await control_plane.call(
            "POST", "/internal/v1/ha/heartbeat", token=token, json={**body, "epoch": epoch}
        )
        assert (reply.status, reply.body["role"], reply.body["epoch"]) == (200, "MASTER", 1), reply.body
        assert reply.body["lease_remaining_s"] == 60


async def test_a_host_bound_credential_heartbeats_for_its_own_host_and_group_only(
    control_plane: ControlPlaneHarness,
) -> None:
    cp = control_plane
    group = {
        "name": "broker-bound", "namesrv_addrs": ["10.0.0.9:9876"], "broker_addrs": ["127.0.0.1:10911"],
        "max_queues": 100, "max_msgs_per_s": 1000, "storage_bytes": 1 << 30,
    }  # fmt: skip
    assert (await cp.call("POST", "/v1/fleet/broker-groups", operator=True, json=group)).status == 201
    made = await cp.call("POST", "/v1/fleet/broker-groups/broker-bound/hosts/127.0.0.1/credential", operator=True)
    assert made.status == 201, made.body
    token = await cp.token_for(made.body["access_key"], made.body["secret"])
    own = Member(cp, token, 0, group="broker-bound")
    assert (await own.beat(0, master_role="SYNC_MASTER"))["role"] == "MASTER"
    # Another group's lease, or its own group's from another host: refused, naming the binding.
    for member, addr in (
        (Member(cp, token, 0, group="broker-other"), None),
        (Member(cp, token, 1, group="broker-bound"), "10.0.0.7:10911"),
    ):
        reply = await member.call(0, **({"addr": addr} if addr else {}))
        assert reply.status == 403, reply.body
        assert "bound to host 127.0.0.1 of broker group broker-bound" in reply.body["error"]["message"]
    assert (await fleet_group(cp, "broker-bound"))["master_id"] == 0
    assert "broker-other" not in {
        g["broker_name"] for g in (await cp.call("GET", "/v1/fleet/ha", operator=True)).body["broker_groups"]
    }


async def test_bad_heartbeats_are_refused(control_plane: ControlPlaneHarness) -> None:
    token = await broker_token(control_plane)
    base = {"cluster": "c1", "broker_name": "broker-y", "member_id": 0, "addr": "127.0.0.1:1", "max_offset": 0,
            "epoch": 0, "lease_s": 5}  # fmt: skip
    for change, field in (
        ({"member_id": 100}, "member_id"),
        ({"addr": "no-port"}, "addr"),
        ({"lease_s": 0}, "lease_s"),
        ({"master_role": "SLAVE"}, "master_role"),
        ({"surprise": 1}, "surprise"),
    ):
        reply = await control_plane.call("POST", "/internal/v1/ha/heartbeat", token=token, json={**base, **change})
        assert reply.status == 400, (change, reply.body)
        assert field in str(reply.body), reply.body
    _tenant, tenant_token = await control_plane.new_tenant("ha-tenant")
    reply = await control_plane.call("POST", "/internal/v1/ha/heartbeat", token=tenant_token, json=base)
    assert reply.status == 403
    reply = await control_plane.call("GET", "/v1/fleet/ha", token=token)
    assert reply.status == 403
