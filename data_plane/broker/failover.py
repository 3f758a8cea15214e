"""FailoverAgent: a broker's side of automatic failover (docs/ha.md#failover).

Every ``failover_check_interval_s`` the broker tells the control plane where it stands
(``POST /internal/v1/ha/heartbeat``: its member id, addresses, max CommitLog offset, epoch) and
does what the answer says: stay or become master under the answer's epoch, or follow the master
it names. The control plane's election is transactional in PostgreSQL (control_plane/services/ha.py).

Each heartbeat names this process (``instance``, random per start: a lease belongs to one
process) and echoes the sequence number of the last answer it took (``heard``): the control
plane renews and elects only members that hear it, so a broker whose answers are lost on the
way back (an asymmetric cut) neither keeps nor wins the group.

Fencing: a master writes only while it holds a lease. An answer says how much of the lease is
left there (``lease_remaining_s``); this broker counts its own copy from the moment it *sent*
the heartbeat, less one check interval, and refuses writes (``Replication.fence``) when it runs
out — always before the control plane could elect someone else. A broker that starts with
failover on takes no writes until its first answer.

Client reachability: a slave probes its master's client address (the one clients use) every
check interval with a request code no broker serves — any answer proves the path — and reports
for how long the probes have failed (``master_unreachable_s``). When every member probing the
master fails, the control plane asks the master to step down (docs/ha.md#failover).

Out of touch: a fenced master that has had no answer for a whole lease asks the name servers
who registers as its group's master (``out_of_touch``; ``Broker.register_all`` hands their
answer to ``Replication.follow_without_control_plane``) and follows that member once it proves
a later epoch over the authenticated HA link — so a control-plane-only cut does not leave the
new master without its slave.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from typing import TYPE_CHECKING, Any

import aiohttp
import orjson

from data_plane.broker.config import BrokerRole
from data_plane.remoting.command import RemotingCommand
from data_plane.tasks import cancel_all
from data_plane.tls import http_ssl

if TYPE_CHECKING:
    from data_plane.broker.broker import Broker

log = logging.getLogger(__name__)

HEARTBEAT_PATH = "/internal/v1/ha/heartbeat"
# A request code no broker serves: answered at once with REQUEST_CODE_NOT_SUPPORTED, before any
# authentication, which is all a reachability probe needs.
PROBE_CODE = 9_999


class FailoverError(Exception):
    """A heartbeat that got no usable answer."""


class FailoverAgent:
    def __init__(self, broker: Broker) -> None:
        cfg = broker.config
        self.broker = broker
        self.url = cfg.control_plane_url.rstrip("/") + HEARTBEAT_PATH
        self.interval_s = cfg.failover_check_interval_s
        self.lease_s = cfg.failover_lease_s
        self.heartbeats = 0
        self.failures = 0
        self.instance = secrets.token_hex(8)  # this process: the lease is this process's, not the member id's
        self.heard = 0  # the seq of the last answer taken
        self.answered_at = time.monotonic()  # when the last answer was taken (start: as if just now)
        self._asked_namesrv_at = 0.0
        self._probed: str = ""  # the master address being probed
        self._probe_ok_at = 0.0  # monotonic: the last answer from it (or when probing it began)
        self._probe_failing = False
        self.probe_failures = 0
        self._reported_slaves = False  # the heartbeat in flight named slaves in sync
        self._session: aiohttp.ClientSession | None = None
        self._fence_timer: asyncio.TimerHandle | None = None
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=max(1.0, self.interval_s * 2)),
            connector=aiohttp.TCPConnector(ssl=http_ssl()),  # ORBIT_TLS_CA: the control plane's CA
        )
        try:
            await self.beat()
        except FailoverError as e:
            log.warning("failover: first heartbeat failed (%s); writes stay fenced until one succeeds", e)
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._run(), name="orbit-failover"),
            loop.create_task(self._probe_loop(), name="orbit-master-probe"),
        ]

    async def stop(self) -> None:
        await cancel_all(self._tasks)
        if self._fence_timer is not None:
            self._fence_timer.cancel()
        if self._session is not None:
            await self._session.close()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.beat()
            except FailoverError as e:
                self.failures += 1
                log.warning("failover heartbeat failed: %s", e)
            except Exception:
                self.failures += 1
                log.exception("failover heartbeat failed")
            if self.out_of_touch and self.broker.replication.is_master:
                await self._ask_namesrv()

    async def _probe_loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            rep = self.broker.replication
            target = "" if rep.is_master else rep.master_addr
            if target != self._probed:
                self._probed, self._probe_ok_at, self._probe_failing = target, time.monotonic(), False
            if not target:
                continue
            client = self.broker.namesrv_client
            try:
                await client.invoke(target, RemotingCommand(PROBE_CODE), int(self.interval_s * 900))
            except Exception:  # unreachable, reset, timed out: the path clients take is cut
                self._probe_failing = True
                self.probe_failures += 1
                client.close_connection(target)  # the next probe opens a new connection
            else:
                self._probe_ok_at, self._probe_failing = time.monotonic(), False

    def master_unreachable_s(self) -> float | None:
        """For how long the probes of the master's client address have failed (0: the last
        answered); None when not probing (a master, or no master known)."""
        if not self._probed or self._probed != self.broker.replication.master_addr:
            return None  # not probing, or probing a master this slave no longer follows
        return round(time.monotonic() - self._probe_ok_at, 3) if self._probe_failing else 0.0

    @property
    def out_of_touch(self) -> bool:
        """No answer from the control plane for a whole lease: it may have elected another."""
        return time.monotonic() - self.answered_at > self.lease_s

    async def _ask_namesrv(self) -> None:
        """Register now (at most every two check intervals): the name servers' answer names the
        group's master, if another member registers as one."""
        now = time.monotonic()
        if now - self._asked_namesrv_at < 2 * self.interval_s:
            return
        self._asked_namesrv_at = now
        try:
            await self.broker.register_all()
        except Exception:
            log.exception("registering with the name servers failed")

    def _request(self) -> dict[str, Any]:
        b = self.broker
        rep = b.replication
        cfg = b.config
        lagging = rep.lag()
        in_sync = rep.in_sync()
        self._reported_slaves = bool(in_sync)
        if in_sync:
            # From the moment the control plane may count a slave electable, this master
            # acknowledges nothing alone (until an answer confirms it alone again).
            rep.confirmed_sync_set = None
        lag = lagging[0] if lagging is not None else -1
        return {
            "cluster": cfg.cluster_name,
            "broker_name": cfg.broker_name,
            "member_id": cfg.broker_id,
            "addr": b.address,
            "ha_addr": rep.ha_addr,
            "max_offset": b.store.max_phy_offset(),
            "epoch": rep.epoch,
            "acting_master": rep.writable,
            "master_role": cfg.broker_role.value if cfg.is_master else rep.master_role.value,
            **({"lag_bytes": lag} if lag >= 0 else {}),
            "lease_s": self.lease_s,
            "interval_s": self.interval_s,
            "instance": self.instance,
            "heard": self.heard,
            "log_epoch": rep.log_epoch,
            **({"in_sync": in_sync} if in_sync is not None else {}),
            **({"master_unreachable_s": u} if (u := self.master_unreachable_s()) is not None else {}),
        }

    async def beat(self) -> None:
        assert self._session is not None
        tenancy = self.broker.tenancy
        if tenancy is None or tenancy.token_source is None:
            raise FailoverError("no broker credential to call the control plane with")
        sent_at = time.monotonic()
        try:
            token = await tenancy.token_source.token()
            async with self._session.post(
                self.url,
                data=orjson.dumps(self._request()),
                headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
            ) as resp:
                status, raw = resp.status, await resp.read()
        except Exception as e:  # transport, timeout, and the token endpoint's errors (sdk.errors)
            raise FailoverError(f"{type(e).__name__}: {e}") from None
        if status != 200:
            # 409: another process runs as this member (or its previous process was heard a
            # moment ago: a fast restart waits a check interval or two).
            raise FailoverError(f"HTTP {status}: {raw[:300]!r}")
        try:
            answer = orjson.loads(raw)
            role = str(answer["role"])
            epoch = int(answer["epoch"])
            master_role = BrokerRole(str(answer["master_role"]))
            master_addr = str(answer.get("master_addr") or "")
            master_ha_addr = str(answer.get("master_ha_addr") or "")
            seq = int(answer["seq"])
            remaining = float(answer.get("lease_remaining_s", 0.0)) if role == "MASTER" else 0.0
            raw_set = answer.get("sync_set")
            sync_set = sorted(int(m) for m in raw_set) if isinstance(raw_set, list) else None
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as e:
            raise FailoverError(f"unusable answer: {e}") from None
        rep = self.broker.replication
        if role == "MASTER":
            # Counted from when the heartbeat was sent, one interval short: never past the
            # control plane's own expiry. An answer that arrives after that is no lease at all
            # (and is not taken: the control plane sees this broker did not hear it).
            deadline = sent_at + min(self.lease_s, remaining) - self.interval_s
            if time.monotonic() >= deadline:
                raise FailoverError("the lease answer came after the lease's own deadline")
        self.heartbeats += 1
        self.heard = seq
        self.answered_at = time.monotonic()
        if role == "MASTER":
            self._hold_lease(deadline)
            await rep.become_master(epoch, master_role, lease_deadline=deadline)
            rep.confirmed_sync_set = None if self._reported_slaves else sync_set
        elif master_ha_addr:
            if await rep.become_slave(epoch, master_addr, master_ha_addr):
                await self.broker.register_all()  # the new id and master, at once (not every beat)
        elif rep.is_master:
            rep.fence("the control plane names no master (none elected yet, or this one asked to step down)")

    def _hold_lease(self, until_monotonic: float) -> None:
        loop = asyncio.get_running_loop()
        if self._fence_timer is not None:
            self._fence_timer.cancel()
        delay = until_monotonic - time.monotonic()
        self._fence_timer = loop.call_later(max(0.0, delay), self.broker.replication.fence, "the master lease ran out")

    def runtime_info(self) -> dict[str, Any]:
        info: dict[str, Any] = {
            "failoverHeartbeats": self.heartbeats,
            "failoverFailures": self.failures,
            "failoverProbeFailures": self.probe_failures,
        }
        if (u := self.master_unreachable_s()) is not None:
            info["failoverMasterUnreachableS"] = u
        return info
