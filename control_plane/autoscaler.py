"""The autoscaler: topics' writable queues follow their publish rate, and draining broker groups
hand their share to the others — with no tenant action (docs/elasticity.md).

Every ``interval_s`` it reads each topic's publish rate over the last ``window_s`` from the
brokers' load reports (``LoadView``) and asks ``scaling_policy.decide`` what it should have:

- **grow**: read-only queues of the topic (being drained) take messages again first; then new
  queues are placed on active broker groups with headroom (not on a group whose reported rate is
  past ``hot_group_at`` of its ``max_msgs_per_s``), within the tenant's plan (``max_queues``);
- **shrink**: queues become read-only (writable queues are ``[0, write)`` of each group, as
  RocketMQ's writeQueueNums makes them), taken from the groups holding most — but not while a
  group holding the topic's writable queues is hot: the rates the brokers report are what they
  stored, and a saturated group stores what it can, not what its clients offer, so a topic's
  low rate there may be the overload itself (the hold is recorded, once every ``refuse_every_s``);
- **remove**: once every consumer group of the tenant that consumes the topic has committed all
  of a read-only queue (``DrainCheck``, asking the brokers), or, when none consumes it, once the
  queue holds no message, the queue goes — no message left behind;
- **move**: a broker group an operator set ``draining`` stops taking the topic's messages (its
  queues read-only, then removed as above) and as many writable queues are placed elsewhere.

Ordered (FIFO) topics are not scaled: their sharding keys map to queues by count, so a change
would move message groups between queues and deliver out of order; the refusal is recorded.
Every change is a scaling event the tenant can list, and the reconciler carries it to the
brokers and name servers (a placement is changed again only once the last change is applied).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from control_plane import placement
from control_plane.db import Connection, Pool, Record
from control_plane.errors import InsufficientCapacity
from control_plane.repositories import fleet as fleet_repo
from control_plane.repositories import plans as plans_repo
from control_plane.repositories import scaling as repo
from control_plane.repositories import topics as topics_repo
from control_plane.scaling_policy import Decision, ScalingSettings, decide, is_low, shrink_plan
from data_plane.tasks import cancel_all

log = logging.getLogger(__name__)

Key = tuple[str, str]  # tenant, topic


class LoadView(Protocol):
    async def rates(self, window_s: float) -> tuple[dict[Key, float], dict[str, float]]:
        """Publish msgs/s over the window of each topic with reports (absent: none) and of each
        broker group."""
        ...


class DrainCheck(Protocol):
    async def drained(self, tenant: str, topic: str, group: str, first: int, end: int) -> bool:
        """Whether queues ``[first, end)`` of the topic on ``group`` hold nothing unconsumed."""
        ...


@dataclass
class _Topic:
    tenant: str
    name: str
    ordered: bool
    minimum: int
    placements: list[Record] = field(default_factory=list)

    @property
    def key(self) -> Key:
        return self.tenant, self.name


class Autoscaler:
    def __init__(
        self,
        pool: Pool,
        load: LoadView,
        drains: DrainCheck,
        settings: ScalingSettings,
        *,
        interval_s: float = 10.0,
        window_s: float = 20.0,
        hot_group_at: float = 0.8,
        refuse_every_s: float = 600.0,
        clock: Callable[[], float] = time.monotonic,
        on_change: Callable[[], None] = lambda: None,
    ) -> None:
        settings.check()
        self.pool = pool
        self.load = load
        self.drains = drains
        self.settings = settings
        self.interval_s = interval_s
        self.window_s = window_s
        self.hot_group_at = hot_group_at
        self.refuse_every_s = refuse_every_s
        self.clock = clock
        self.on_change = on_change  # told after a round that changed a placement
        self.rounds = 0
        self.changes = 0
        self._low_since: dict[Key, float] = {}
        self._refused_at: dict[tuple[Key, str], float] = {}
        self._task: asyncio.Task[None] | None = None
        self._round_lock = asyncio.Lock()

    # --- life cycle -------------------------------------------------------------------------------
    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="orbit-autoscaler")

    async def close(self) -> None:
        if self._task is not None:
            await cancel_all([self._task])
            self._task = None

    async def _run(self) -> None:
        while True:
            try:
                await self.round()
            except Exception:  # a round that failed is tried again next interval
                log.exception("autoscaler round failed")
            await asyncio.sleep(self.interval_s)

    # --- a round ----------------------------------------------------------------------------------
    async def round(self) -> None:
        async with self._round_lock:
            topics = _topics(await repo.elastic_topics(self.pool))
            rates, group_rates = await self.load.rates(self.window_s)
            hot = await self._hot_groups(group_rates)
            now = self.clock()
            before = self.changes
            for t in topics:
                try:
                    await self._topic(t, rates.get(t.key), hot, now)
                except Exception:
                    log.exception("autoscaler: topic %s of %s", t.name, t.tenant)
            self.rounds += 1
            if self.changes != before:
                self.on_change()

    async def _hot_groups(self, rates: dict[str, float]) -> set[str]:
        async with self.pool.acquire() as conn:
            groups = await fleet_repo.list_broker_groups(conn)
        return {
            g["name"]
            for g in groups
            if int(g["max_msgs_per_s"]) > 0 and rates.get(g["name"], 0.0) > self.hot_group_at * int(g["max_msgs_per_s"])
        }

    async def _topic(self, t: _Topic, rate: float | None, hot: set[str], now: float) -> None:
        if not all(p["applied"] for p in t.placements):
            return  # the last change is not on the brokers yet
        moving = [p for p in t.placements if p["group_status"] == "draining" and p["write_queue_count"] > 0]
        if moving:
            await self._move(t, moving, rate, hot)
            return
        for p in t.placements:
            if p["write_queue_count"] < p["queue_count"]:
                await self._finish_drain(t, p)
        if rate is None:
            self._low_since.pop(t.key, None)
            return
        writable, _every = repo.totals(t.placements)
        if is_low(rate, writable, self.settings):
            low_for = now - self._low_since.setdefault(t.key, now)
        else:
            self._low_since.pop(t.key, None)
            low_for = 0.0
        decision = decide(rate=rate, writable=writable, minimum=t.minimum, low_for_s=low_for, settings=self.settings)
        if decision is None:
            return
        if t.ordered:
            await self._refuse(
                t, "ordered", rate, f"{decision.reason}; an ordered topic keeps its queues: changing them would "
                "move message groups between queues and deliver them out of order"
            )  # fmt: skip
            return
        if decision.action == "grow":
            await self._grow(t, decision, rate, hot)
            return
        busy = sorted({p["broker_group"] for p in t.placements if p["broker_group"] in hot and p["write_queue_count"]})
        if busy:
            await self._refuse(
                t, "hot", rate, f"{decision.reason}; broker group {', '.join(busy)} is near its capacity, where a "
                "topic's rate is what the group stores, not what its clients offer: the queues stay"
            )  # fmt: skip
            return
        await self._shrink(t, decision, rate)
        self._low_since.pop(t.key, None)

    # --- the changes ------------------------------------------------------------------------------
    async def _grow(self, t: _Topic, d: Decision, rate: float | None, hot: set[str], *, action: str = "grow") -> None:
        refused: str | None = None
        async with self.pool.acquire() as conn, conn.transaction():
            placements = await repo.lock_placements(conn, tenant_id=t.tenant, topic=t.name)
            writable, _every = repo.totals(placements)
            need = d.writable - writable
            if need <= 0:
                return
            cool = [g for g in await fleet_repo.lock_active_groups(conn) if g["name"] not in hot]
            active = {g["name"] for g in cool}
            for p in placements:  # read-only queues take messages again first
                spare = int(p["queue_count"]) - int(p["write_queue_count"])
                if need > 0 and spare > 0 and p["broker_group"] in active:
                    k = min(need, spare)
                    await _set_writable(conn, t, p, int(p["write_queue_count"]) + k)
                    need -= k
            if need > 0:
                limits = await plans_repo.effective_limits(conn, tenant_id=t.tenant)
                _topics, used = await topics_repo.count_topics_and_queues(conn, tenant_id=t.tenant)
                allowed = min(need, limits["max_queues"] - used)
                if allowed < need:
                    refused = f"the plan allows {limits['max_queues']} queues and the tenant has {used}"
                groups = [
                    placement.GroupCapacity(r["name"], int(r["max_queues"]), int(r["placed_queues"])) for r in cool
                ]
                if allowed > 0:
                    try:
                        spread = placement.spread(allowed, groups)
                    except InsufficientCapacity as e:
                        refused, spread = e.message, {}
                    await topics_repo.add_placements(conn, tenant_id=t.tenant, topic=t.name, queues_by_group=spread)
                    await repo.mark_provisioning(conn, tenant_id=t.tenant, topic=t.name)
            after = await repo.lock_placements(conn, tenant_id=t.tenant, topic=t.name)
            write, every = repo.totals(after)
            if write > writable:
                self.changes += 1
                await repo.add_event(conn, tenant_id=t.tenant, topic=t.name, action=action, write_queues=write,
                                     read_queues=every, publish_rate=rate, reason=d.reason)  # fmt: skip
                log.info(
                    "autoscaler: %s of %s %s to %d writable queues (%s)", t.name, t.tenant, action, write, d.reason
                )
        if refused is not None:
            await self._refuse(t, "capacity", rate, f"{d.reason}; wanted {d.writable} writable queues, but {refused}")

    async def _shrink(self, t: _Topic, d: Decision, rate: float) -> None:
        async with self.pool.acquire() as conn, conn.transaction():
            placements = await repo.lock_placements(conn, tenant_id=t.tenant, topic=t.name)
            writable, _every = repo.totals(placements)
            remove = writable - max(1, d.writable)
            if remove <= 0:
                return
            taken = shrink_plan({p["broker_group"]: int(p["write_queue_count"]) for p in placements}, remove)
            for p in placements:
                k = taken.get(p["broker_group"], 0)
                if k:
                    await _set_writable(conn, t, p, int(p["write_queue_count"]) - k)
            write, every = repo.totals(await repo.lock_placements(conn, tenant_id=t.tenant, topic=t.name))
            reason = f"{d.reason}; {every - write} queues read-only until their consumers drain them"
            self.changes += 1
            await repo.add_event(conn, tenant_id=t.tenant, topic=t.name, action="shrink", write_queues=write,
                                 read_queues=every, publish_rate=rate, reason=reason)  # fmt: skip
        log.info("autoscaler: %s of %s shrinks to %d writable queues (%s)", t.name, t.tenant, write, d.reason)

    async def _move(self, t: _Topic, moving: list[Record], rate: float | None, hot: set[str]) -> None:
        """A draining group's writable queues become read-only; as many are placed elsewhere."""
        async with self.pool.acquire() as conn, conn.transaction():
            placements = await repo.lock_placements(conn, tenant_id=t.tenant, topic=t.name)
            writable, _every = repo.totals(placements)
            groups = {p["broker_group"] for p in moving}
            for p in placements:
                if p["broker_group"] in groups and p["write_queue_count"] > 0:
                    await _set_writable(conn, t, p, 0)
                    self.changes += 1
        names = ", ".join(sorted(groups))
        await self._grow(t, Decision("grow", writable, f"broker group {names} is draining"), rate, hot, action="move")

    async def _finish_drain(self, t: _Topic, p: Record) -> None:
        group, write, read = str(p["broker_group"]), int(p["write_queue_count"]), int(p["queue_count"])
        if not await self.drains.drained(t.tenant, t.name, group, write, read):
            return
        async with self.pool.acquire() as conn, conn.transaction():
            now = {r["broker_group"]: r for r in await repo.lock_placements(conn, tenant_id=t.tenant, topic=t.name)}
            cur = now.get(group)
            if cur is None or (int(cur["write_queue_count"]), int(cur["queue_count"])) != (write, read):
                return  # changed meanwhile: checked again next round
            await repo.set_queues(conn, tenant_id=t.tenant, topic=t.name, group=group, read=write, write=write)
            w, every = repo.totals(await repo.lock_placements(conn, tenant_id=t.tenant, topic=t.name))
            reason = f"queues {write}..{read - 1} on {group} drained by every consumer group, and removed"
            self.changes += 1
            await repo.add_event(conn, tenant_id=t.tenant, topic=t.name, action="remove", write_queues=w,
                                 read_queues=every, publish_rate=None, reason=reason)  # fmt: skip
        log.info("autoscaler: %s of %s: %s", t.name, t.tenant, reason)

    async def _refuse(self, t: _Topic, kind: str, rate: float | None, reason: str) -> None:
        """Record a refusal, at most once every ``refuse_every_s`` a topic and kind."""
        now = self.clock()
        last = self._refused_at.get((t.key, kind))
        if last is not None and now - last < self.refuse_every_s:
            return
        self._refused_at[(t.key, kind)] = now
        async with self.pool.acquire() as conn:
            write, every = repo.totals(await topics_repo.placements_of(conn, tenant_id=t.tenant, topic=t.name))
            await repo.add_event(conn, tenant_id=t.tenant, topic=t.name, action="refuse", write_queues=write,
                                 read_queues=every, publish_rate=rate, reason=reason)  # fmt: skip
        log.info("autoscaler: %s of %s not scaled: %s", t.name, t.tenant, reason)


async def _set_writable(conn: Connection, t: _Topic, p: Record, write: int) -> None:
    """The placement's writable queues become ``[0, write)``; its queues stay."""
    group, read = str(p["broker_group"]), int(p["queue_count"])
    await repo.set_queues(conn, tenant_id=t.tenant, topic=t.name, group=group, read=read, write=write)


def _topics(rows: list[Record]) -> list[_Topic]:
    out: dict[Key, _Topic] = {}
    for r in rows:
        key = (str(r["tenant_id"]), str(r["name"]))
        t = out.get(key)
        if t is None:
            minimum = placement.queue_count_for(r["throughput_hint_msgs_per_s"])
            t = out[key] = _Topic(key[0], key[1], r["message_type"] == "FIFO", minimum)
        t.placements.append(r)
    return list(out.values())
