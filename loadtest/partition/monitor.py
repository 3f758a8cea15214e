"""Monitor: what each member and the control plane say, sampled every ~150 ms.

- Members: ``GET_BROKER_RUNTIME_INFO`` on each member's own port (not through its proxies, so a
  cut does not blind the monitor): ``brokerRole``, ``haFenced``, ``haEpoch``, ``haConnected``,
  ``commitLogMaxOffset``, ``bootTimestamp`` (which process it is) and ``loopStallMaxMs`` (the
  longest event-loop stall since that process started; None where a broker does not say).
  Both members are asked at once, so one round is one moment: a round where both are master and
  unfenced is two writable masters at the same time.
- The control plane: ``GET /v1/fleet/ha`` (operator), this group's epoch, master and lease, and
  ``history`` — the latest elections as ``{"epoch", "master_id", "elected_at"}`` (ISO-8601) —
  merged by epoch into every election seen since the monitor started (the view shows the latest
  20; polled every 200 ms, none is missed).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import datetime as dt
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from loadtest.partition.cluster import MEMBERS, PartitionCluster
from sdk.admin import AdminClient

log = logging.getLogger(__name__)

MASTER_ROLES = ("SYNC_MASTER", "ASYNC_MASTER")
MAX_ROUNDS = 200_000  # ~8 hours of rounds at 150 ms


@dataclass(frozen=True, slots=True)
class MemberSample:
    member: int
    up: bool
    role: str = ""
    fenced: bool | None = None
    epoch: int = -1
    linked: bool = False  # a slave replicating from its master
    max_offset: int = -1
    boot: int = 0  # bootTimestamp: which process answered
    stall_ms: float | None = None  # loopStallMaxMs

    @property
    def writable(self) -> bool:
        return self.up and self.role in MASTER_ROLES and self.fenced is False


@dataclass(frozen=True, slots=True)
class Round:
    at: float  # monotonic, when the round was asked
    wall: float
    members: tuple[MemberSample, ...]

    @property
    def writable(self) -> list[int]:
        return [s.member for s in self.members if s.writable]


@dataclass(frozen=True, slots=True)
class Election:
    epoch: int
    master_id: int
    elected_at: float  # wall clock, seconds


@dataclass
class FleetView:
    at: float
    epoch: int
    master_id: int | None
    lease_remaining_s: float
    history: list[Election] | None  # None: this control plane does not publish it


def parse_history(raw: Any) -> list[Election] | None:
    if not isinstance(raw, list):
        return None
    out = []
    for e in raw:
        stamp = dt.datetime.fromisoformat(str(e["elected_at"]).replace("Z", "+00:00"))
        if stamp.tzinfo is None:
            stamp = stamp.replace(tzinfo=dt.UTC)
        out.append(Election(int(e["epoch"]), int(e["master_id"]), stamp.timestamp()))
    return sorted(out, key=lambda x: x.epoch)


@dataclass
class Monitor:
    cluster: PartitionCluster
    every_s: float = 0.15
    fleet_every_s: float = 0.2
    rounds: collections.deque[Round] = field(default_factory=lambda: collections.deque(maxlen=MAX_ROUNDS))
    fleet: FleetView | None = None
    history: list[Election] | None = None
    fleet_errors: int = 0
    _admin: AdminClient | None = None
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    async def start(self) -> None:
        self._admin = AdminClient(self.cluster.namesrv, timeout_ms=1000)
        self._tasks = [
            asyncio.create_task(self._members_loop(), name="monitor-members"),
            asyncio.create_task(self._fleet_loop(), name="monitor-fleet"),
        ]

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(BaseException):
                await t
        if self._admin is not None:
            await self._admin.close()

    async def _members_loop(self) -> None:
        while True:
            began = time.monotonic()
            await self.sample()
            await asyncio.sleep(max(0.0, self.every_s - (time.monotonic() - began)))

    async def sample(self) -> Round:
        at, wall = time.monotonic(), time.time()
        samples = await asyncio.gather(*(self._member(m) for m in MEMBERS))
        r = Round(at, wall, tuple(samples))
        self.rounds.append(r)
        return r

    async def _member(self, m: int) -> MemberSample:
        assert self._admin is not None
        if not self.cluster.members[m].alive:
            return MemberSample(m, up=False)
        try:
            st = await self._admin.broker_status(self.cluster.real_addr(m))
        except Exception:
            return MemberSample(m, up=False)
        stall = st.get("loopStallMaxMs")
        return MemberSample(
            m, up=True, role=st.get("brokerRole", ""),
            fenced={"True": True, "False": False}.get(st.get("haFenced", "")),
            epoch=int(st.get("haEpoch", "-1")), linked=st.get("haConnected") == "True",
            max_offset=int(st.get("commitLogMaxOffset", "-1")), boot=int(st.get("bootTimestamp", "0")),
            stall_ms=float(stall) if stall not in (None, "") else None,
        )  # fmt: skip

    async def _fleet_loop(self) -> None:
        while True:
            began = time.monotonic()
            try:
                await self.fleet_now()
            except Exception as e:
                self.fleet_errors += 1
                log.debug("fleet view: %s", e)
            await asyncio.sleep(max(0.0, self.fleet_every_s - (time.monotonic() - began)))

    async def fleet_now(self) -> FleetView | None:
        assert self.cluster.operator is not None
        g = await self.cluster.operator.fleet_ha()
        if g is None:
            return None
        history = parse_history(g.get("history"))
        view = FleetView(time.monotonic(), int(g["epoch"]), g.get("master_id"), float(g["lease_remaining_s"]), history)
        self.fleet = view
        if history is not None:
            # The fleet view shows the latest elections only: keep every one seen, by epoch.
            known = {e.epoch: e for e in self.history or []}
            known.update((e.epoch, e) for e in history)
            self.history = sorted(known.values(), key=lambda x: x.epoch)
        return view

    # --- reading it -------------------------------------------------------------------------------------
    def latest(self) -> Round | None:
        return self.rounds[-1] if self.rounds else None

    def master(self) -> int | None:
        """The member acting as master now: the writable one, else the control plane's, else 0."""
        r = self.latest()
        if r is not None and len(r.writable) == 1:
            return r.writable[0]
        if self.fleet is not None and self.fleet.master_id is not None:
            return int(self.fleet.master_id)
        return None

    def rounds_between(self, t0: float, t1: float) -> list[Round]:
        return [r for r in self.rounds if t0 <= r.at <= t1]

    def transitions(self, t0: float, t1: float) -> list[dict[str, Any]]:
        """Each member's changes of state in [t0, t1] (seconds from t0): up or down, role, fenced,
        epoch, linked, with its CommitLog's end at that moment."""
        out: list[dict[str, Any]] = []
        last: dict[int, tuple[Any, ...]] = {}
        for r in self.rounds:
            for s in r.members:
                state = (s.up, s.role, s.fenced, s.epoch, s.linked)
                if r.at >= t0 and r.at <= t1 and last.get(s.member) != state:
                    out.append({"t": round(r.at - t0, 2), "member": s.member, "up": s.up, "role": s.role,
                                "fenced": s.fenced, "epoch": s.epoch, "linked": s.linked,
                                "max_offset": s.max_offset})  # fmt: skip
                last[s.member] = state
        return out
