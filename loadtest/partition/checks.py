"""What must hold after every schedule, and the figures of every cut.

After a schedule everything is healed and dead members are started again; once the group has
settled (one writable master, the other member a linked slave, and the control plane naming the
same master) the producers pause and:

(a) every acknowledged message of the run is readable from the master, byte for byte (read with
    pulls through every queue, on the member's own port);
(b) no two members took writes at the same time:
    - every SEND_OK's store timestamp (the stored copy's; every process shares this machine's
      clock) lies within the tenure of the member that answered — from its election's
      ``elected_at`` to the next election's, widened by ``TENURE_TOLERANCE_S`` — in the control
      plane's election history;
    - no monitor round saw both members master and unfenced;
(c) the other member's log is the master's: the same ``commitLogMaxOffset``, the same messages
    by id and body.

Figures of a step (``window_figures``): the longest time without a SEND_OK from the cut's start
until 3 s after its heal (a gap that began in that window counts whole), the time from the heal
to the next SEND_OK, and the longest event-loop stall a member reported during the step.
"""

from __future__ import annotations

import asyncio
import bisect
import time
from dataclasses import dataclass, field
from typing import Any

from loadtest.partition.cluster import GROUP, MEMBERS, PartitionCluster
from loadtest.partition.monitor import Election, Monitor, Round
from loadtest.partition.recorder import QUEUES, TOPIC, Ack, Recorder
from sdk import MessageExt, MessageQueue, protocol
from sdk.admin import AdminClient

# Store timestamps are whole milliseconds and elected_at is PostgreSQL's now() (its transaction's
# start, before the winner hears of it): a correct group needs no tolerance at all; this covers
# rounding only.
TENURE_TOLERANCE_S = 0.05
AFTER_HEAL_S = 3.0  # a cut's window for gaps runs until this long after its heal
SETTLE_TIMEOUT_S = 60.0
CONVERGE_TIMEOUT_S = 30.0


@dataclass(frozen=True, slots=True)
class Stored:
    body: bytes
    store_timestamp_ms: int


async def pull_everything(admin: AdminClient, addr: str, topic: str, broker_name: str, queues: int) -> list[MessageExt]:
    """Every message of ``topic``'s first ``queues`` queues stored at ``addr``, read with pulls
    (CRC checked), in queue order."""
    out: list[MessageExt] = []
    for q in range(queues):
        mq = MessageQueue(topic, broker_name, q)
        offset = 0
        while True:
            cmd = protocol.pull_request(
                group="verify-reader", mq=mq, offset=offset, max_nums=256, subscription="*", sub_version=0,
                suspend_timeout_ms=0, commit_offset=0, suspend=False, expression_type="TAG",
            )  # fmt: skip
            resp = await admin.client.invoke(addr, cmd, 10_000)
            result = protocol.parse_pull_response(resp, broker_name, addr, check_crc=True)
            if not result.messages:
                break
            out.extend(result.messages)
            offset = result.next_begin_offset
    return out


async def read_all(admin: AdminClient, addr: str) -> dict[str, Stored]:
    """Every message of the load's topic stored at ``addr``, by message id."""
    return {
        m.msg_id: Stored(m.body, m.store_timestamp_ms) for m in await pull_everything(admin, addr, TOPIC, GROUP, QUEUES)
    }


@dataclass
class Verdict:
    settled: bool = False
    master: int | None = None
    settle_s: float = 0.0
    unsettled: str = ""  # what the group looked like when it did not settle
    acked: int = 0
    lost: list[int] = field(default_factory=list)  # message numbers
    changed: list[int] = field(default_factory=list)
    tenure_checked: bool = False
    tenure_violations: list[dict[str, Any]] = field(default_factory=list)
    overlap_rounds: list[dict[str, Any]] = field(default_factory=list)
    converged: bool = False
    convergence: str = ""
    elections: list[dict[str, Any]] = field(default_factory=list)

    @property
    def overlaps(self) -> int:
        return len(self.tenure_violations) + len(self.overlap_rounds)

    @property
    def ok(self) -> bool:
        return self.settled and not self.lost and not self.changed and not self.overlaps and self.converged

    def brief(self) -> dict[str, Any]:
        return {
            "settled": self.settled, "settle_s": round(self.settle_s, 2), "master": self.master,
            "acked": self.acked, "lost": len(self.lost), "changed": len(self.changed),
            "overlapping_masters": self.overlaps, "tenure_checked": self.tenure_checked,
            "converged": self.converged,
            **({"lost_first": self.lost[:10]} if self.lost else {}),
            **({"tenure_violations": self.tenure_violations[:5]} if self.tenure_violations else {}),
            **({"overlap_rounds": self.overlap_rounds[:5]} if self.overlap_rounds else {}),
            **({"convergence": self.convergence} if not self.converged else {}),
            **({"unsettled": self.unsettled} if self.unsettled else {}),
        }  # fmt: skip


def describe_round(r: Round) -> str:
    return ", ".join(
        f"member {s.member}: " + (f"{s.role} epoch {s.epoch}{' fenced' if s.fenced else ''}"
                                  f"{' linked' if s.linked else ''} at {s.max_offset}" if s.up else "down")
        for s in r.members
    )  # fmt: skip


def _settled(r: Round | None) -> int | None:
    """The master of a settled round: one writable member, the other a linked slave."""
    if r is None or len(r.writable) != 1:
        return None
    master = r.writable[0]
    other = next(s for s in r.members if s.member != master)
    return master if other.up and other.role == "SLAVE" and other.linked else None


async def settle(cluster: PartitionCluster, monitor: Monitor, recorder: Recorder, verdict: Verdict) -> None:
    """Heal every path, start dead members, and wait for a settled group that acknowledges writes."""
    began = time.monotonic()
    cluster.heal_all()
    for m in MEMBERS:
        if not cluster.members[m].alive:
            await cluster.start_member(m)
    deadline = began + SETTLE_TIMEOUT_S
    looked_settled: float | None = None  # since when the group has looked settled
    while time.monotonic() < deadline:
        r = await monitor.sample()
        master = _settled(r)
        fleet = monitor.fleet
        if master is None:
            looked_settled, verdict.unsettled = None, describe_round(r)
        elif fleet is None or fleet.master_id != master:
            looked_settled = None
            verdict.unsettled = f"the control plane names master {fleet.master_id if fleet else '?'}, not {master}"
        else:
            looked_settled = looked_settled or r.at
            if recorder.first_ack_after(looked_settled) is not None:
                verdict.settled, verdict.master = True, master
                break
            verdict.unsettled = "no SEND_OK since the group looked settled"
        await asyncio.sleep(0.1)
    verdict.settle_s = time.monotonic() - began


async def verify(
    cluster: PartitionCluster, monitor: Monitor, recorder: Recorder, since: float, verdict: Verdict
) -> None:
    """Checks (a), (b) and (c) with the producers paused; monitor rounds from ``since`` on."""
    await recorder.pause()
    admin = AdminClient(cluster.namesrv, timeout_ms=10_000)
    try:
        master = verdict.master
        if master is None:
            r = monitor.latest()
            master = r.writable[0] if r is not None and len(r.writable) == 1 else monitor.master()
        if master is None:
            verdict.convergence = "no master to read from"
            return
        other = next(m for m in MEMBERS if m != master)
        verdict.converged, verdict.convergence = await _same_end(cluster, admin, master, other)
        stored = await read_all(admin, cluster.real_addr(master))
        acks = list(recorder.acks)
        verdict.acked = len(acks)
        for a in acks:
            s = stored.get(a.msg_id)
            if s is None:
                verdict.lost.append(a.n)
            elif s.body != a.body:
                verdict.changed.append(a.n)
        if verdict.converged:
            theirs = await read_all(admin, cluster.real_addr(other))
            if {k: v.body for k, v in theirs.items()} != {k: v.body for k, v in stored.items()}:
                verdict.converged = False
                verdict.convergence = (
                    f"same end offset, other messages: {len(theirs.keys() - stored.keys())} only on member {other}, "
                    f"{len(stored.keys() - theirs.keys())} only on the master, "
                    f"{sum(1 for k in theirs.keys() & stored.keys() if theirs[k].body != stored[k].body)} differ"
                )
        await monitor.fleet_now()
        history = monitor.history
        if history is not None:
            verdict.tenure_checked = True
            verdict.elections = [{"epoch": e.epoch, "master_id": e.master_id, "elected_at": e.elected_at}
                                 for e in history]  # fmt: skip
            verdict.tenure_violations = tenure_violations(acks, stored, history)
        verdict.overlap_rounds = [
            {"at_wall": r.wall, "members": [(s.member, s.role, s.epoch) for s in r.members]}
            for r in monitor.rounds_between(since, time.monotonic())
            if len(r.writable) > 1
        ]
    finally:
        await admin.close()
        recorder.resume()


async def _same_end(cluster: PartitionCluster, admin: AdminClient, master: int, other: int) -> tuple[bool, str]:
    deadline = time.monotonic() + CONVERGE_TIMEOUT_S
    ends = (-1, -1)
    while time.monotonic() < deadline:
        try:
            a = await admin.broker_status(cluster.real_addr(master))
            b = await admin.broker_status(cluster.real_addr(other))
        except Exception as e:
            ends = (-1, -1)
            last = f"{type(e).__name__}: {e}"
        else:
            ends = (int(a["commitLogMaxOffset"]), int(b["commitLogMaxOffset"]))
            if ends[0] == ends[1]:
                return True, ""
            last = f"commitLogMaxOffset {ends[0]} on the master (member {master}), {ends[1]} on member {other}"
        await asyncio.sleep(0.2)
    return False, last


def tenure_violations(acks: list[Ack], stored: dict[str, Stored], history: list[Election]) -> list[dict[str, Any]]:
    """SEND_OKs whose store timestamp is outside every tenure of the member that answered."""
    starts = [e.elected_at for e in history]
    out = []
    for a in acks:
        s = stored.get(a.msg_id)
        if s is None or a.member is None:
            continue
        t = s.store_timestamp_ms / 1000
        ok = False
        for i, e in enumerate(history):
            if e.master_id != a.member:
                continue
            end = starts[i + 1] if i + 1 < len(starts) else float("inf")
            if e.elected_at - TENURE_TOLERANCE_S <= t <= end + TENURE_TOLERANCE_S:
                ok = True
                break
        if not ok:
            i = bisect.bisect_right(starts, t) - 1
            then = {"epoch": history[i].epoch, "master_id": history[i].master_id} if i >= 0 else None
            out.append({"n": a.n, "member": a.member, "stored_at": t, "tenure_then": then})
    return out


# --- figures ---------------------------------------------------------------------------------------------
def longest_gap(recorder: Recorder, start: float, heal: float, now: float) -> float:
    """The longest time without a SEND_OK that began in [start, heal + AFTER_HEAL_S]: from the
    start (or an acknowledgement in the window) to the next acknowledgement (or ``now``)."""
    times = recorder.ack_times_between(start, heal + AFTER_HEAL_S)
    points = [start, *times]
    worst = 0.0
    for i, p in enumerate(points):
        q = points[i + 1] if i + 1 < len(points) else (recorder.first_ack_after(p) or now)
        worst = max(worst, q - p)
    return worst


def window_figures(recorder: Recorder, monitor: Monitor, start: float, heal: float) -> dict[str, Any]:
    now = time.monotonic()
    after = recorder.first_ack_after(heal)
    return {
        "unavailable_s": round(longest_gap(recorder, start, heal, now), 3),
        "heal_to_send_ok_s": round((after if after is not None else now) - heal, 3),
        "resumed": after is not None,
        "refusals": recorder.refusals_between(start, heal + AFTER_HEAL_S),
        "loop_stall_max_ms": stall_in(monitor, start, heal + AFTER_HEAL_S),
    }


def stall_in(monitor: Monitor, t0: float, t1: float) -> float | None:
    """The longest event-loop stall a member reported during [t0, t1]: ``loopStallMaxMs`` is a
    maximum since the process started, so a stall in the window is a value that rose in it (or
    any value of a process that started in it). None when no member reports the figure."""
    before: dict[tuple[int, int], float] = {}
    worst: float | None = None
    for r in monitor.rounds:
        for s in r.members:
            if s.stall_ms is None:
                continue
            key = (s.member, s.boot)
            if r.at < t0:
                before[key] = s.stall_ms
            elif r.at <= t1:
                if s.stall_ms > before.get(key, 0.0):
                    worst = max(worst or 0.0, s.stall_ms)
                elif worst is None:
                    worst = 0.0
    return worst
