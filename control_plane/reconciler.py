"""Reconciler: drives every broker group towards the desired state kept in PostgreSQL.

    PostgreSQL ──desired_state(group)──▶ Reconciler ──RocketMQ admin requests──▶ master broker
        ▲                                    │            GET_ALL_TOPIC_CONFIG (21) → diff
        └──── topics_applied(group, names) ◀─┘            UPDATE_AND_CREATE_TOPIC (17) / DELETE_TOPIC_IN_BROKER (215)
                                                          GET_ALL_SUBSCRIPTIONGROUP_CONFIG (201) → diff
                                                          UPDATE_AND_CREATE_SUBSCRIPTIONGROUP (200) / DELETE (207)
                                                          ORBIT_SYNC_TENANCY (credentials, tenants, quotas)

Each round reads what a broker has, compares it with what it should have, and sends only the
differences, so a round is idempotent and a broker that lost its config (or was changed behind
the control plane's back) converges on the next round. Only tenant resources (``tenant%name``)
are managed: system topics (TBW102, …) and other unprefixed names are left alone. The tenancy
snapshot (credentials, tenant status, quota shares) is sent whole every round; the broker keeps
the last one on disk and serves with it while the control plane is down.

After the groups, each name server that a broker group lists gets ORBIT_SYNC_TENANCY too: the
access keys of the groups it serves (so it can check the ACL signatures of brokers' registrations
and of stock clients' route lookups) and the fleet — each of those groups with its brokers'
addresses, the only ones it accepts registrations for (data_plane/namesrv/guard.py).

Every request carries the control plane's own operator token (``Authorization: Bearer …``).
Rounds run every ``interval_s`` and at once after ``kick()`` (the API calls it after a change).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypedDict

import orjson

from data_plane.remoting import bodies
from data_plane.remoting.client import RemotingClient
from data_plane.remoting.codes import RequestCode, ResponseCode
from data_plane.remoting.command import RemotingCommand
from data_plane.remoting.errors import RemotingError
from data_plane.tasks import cancel_all
from data_plane.tenancy.namespace import NAME_PATTERN, SEPARATOR, TENANT_PATTERN
from data_plane.tls import client_context_from_env

log = logging.getLogger(__name__)

_TENANT_RESOURCE = re.compile(f"^{TENANT_PATTERN}{SEPARATOR}{NAME_PATTERN}$")


class DesiredTopic(TypedDict):
    name: str  # wire name: tenant%topic
    read_queue_nums: int
    write_queue_nums: int
    perm: int
    order: bool


class DesiredGroup(TypedDict):
    name: str  # wire name: tenant%group
    retry_max_times: int
    consume_orderly: bool


class DesiredBrokerState(TypedDict):
    topics: list[DesiredTopic]
    groups: list[DesiredGroup]
    tenancy: dict[str, Any]  # the ORBIT_SYNC_TENANCY snapshot, sent as it is


@dataclass(frozen=True)
class BrokerTarget:
    group: str  # the broker group (RocketMQ broker name)
    addrs: tuple[str, ...]  # its masters' client addresses
    namesrv_addrs: tuple[str, ...] = ()  # the name servers its brokers register with


class StateSource(Protocol):
    """Where desired state comes from (the control plane's services)."""

    async def broker_targets(self) -> list[BrokerTarget]: ...

    async def desired_state(self, group: str) -> DesiredBrokerState: ...

    async def topics_applied(self, group: str, names: Sequence[str]) -> None: ...


@dataclass
class GroupReport:
    group: str
    created_topics: list[str] = field(default_factory=list)
    updated_topics: list[str] = field(default_factory=list)
    deleted_topics: list[str] = field(default_factory=list)
    created_groups: list[str] = field(default_factory=list)
    deleted_groups: list[str] = field(default_factory=list)
    tenancy_version: int = 0
    errors: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        topics = self.created_topics or self.updated_topics or self.deleted_topics
        return bool(topics or self.created_groups or self.deleted_groups)


class ReconcileError(Exception):
    """A broker refused or did not answer a reconcile request."""


class Reconciler:
    def __init__(
        self,
        source: StateSource,
        token: Callable[[], Awaitable[str]],
        *,
        interval_s: float = 10.0,
        timeout_ms: int = 5000,
    ) -> None:
        self.source = source
        self._token = token
        self.interval_s = interval_s
        self.timeout_ms = timeout_ms
        self.client = RemotingClient(ssl_context=client_context_from_env())  # ORBIT_TLS_CA: brokers over TLS
        self.rounds = 0
        self.last_reports: list[GroupReport] = []
        self.namesrv_errors: dict[str, str] = {}  # name server → why its last sync failed
        self._kick = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._round_lock = asyncio.Lock()

    # --- life cycle -------------------------------------------------------------------------------
    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="orbit-reconciler")

    async def close(self) -> None:
        if self._task is not None:
            await cancel_all([self._task])
            self._task = None
        await self.client.close()

    def kick(self) -> None:
        """Run a round now (after an API change) instead of at the next interval."""
        self._kick.set()

    async def _run(self) -> None:
        while True:
            try:
                await self.reconcile_once()
            except Exception:  # a bad round must not end reconciliation
                log.exception("reconcile round failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._kick.wait(), self.interval_s)
            self._kick.clear()

    # --- one round --------------------------------------------------------------------------------
    async def reconcile_once(self) -> list[GroupReport]:
        async with self._round_lock:
            targets = await self.source.broker_targets()
            desired: dict[str, DesiredBrokerState] = {}
            reports = await asyncio.gather(*(self._reconcile_group(t, desired) for t in targets))
            await self._reconcile_namesrvs(targets, desired)
            self.rounds += 1
            self.last_reports = list(reports)
            return self.last_reports

    async def _reconcile_group(self, target: BrokerTarget, seen: dict[str, DesiredBrokerState]) -> GroupReport:
        report = GroupReport(target.group)
        try:
            desired = await self.source.desired_state(target.group)
        except Exception as e:
            report.errors.append(f"desired state: {e}")
            return report
        seen[target.group] = desired
        all_ok = bool(target.addrs)
        for addr in target.addrs:
            try:
                await self._reconcile_broker(addr, desired, report)
            except (ReconcileError, RemotingError) as e:
                all_ok = False
                report.errors.append(f"{addr}: {e}")
                log.warning("reconciling broker group %s at %s failed: %s", target.group, addr, e)
        if all_ok:
            await self.source.topics_applied(target.group, [t["name"] for t in desired["topics"]])
        if report.changed:
            log.info(
                "broker group %s: topics +%d ~%d -%d, groups +%d -%d",
                target.group,
                len(report.created_topics),
                len(report.updated_topics),
                len(report.deleted_topics),
                len(report.created_groups),
                len(report.deleted_groups),
            )
        return report

    async def _reconcile_broker(self, addr: str, desired: DesiredBrokerState, report: GroupReport) -> None:
        # Topics
        have = (await self._call_json(addr, RemotingCommand(RequestCode.GET_ALL_TOPIC_CONFIG))).get(
            "topicConfigTable", {}
        )
        want = {t["name"]: t for t in desired["topics"]}
        for name, t in want.items():
            cur = have.get(name)
            if cur is None or _topic_differs(cur, t):
                await self._call(
                    addr,
                    RemotingCommand(
                        RequestCode.UPDATE_AND_CREATE_TOPIC,
                        ext_fields={
                            "topic": name,
                            "defaultTopic": "TBW102",
                            "readQueueNums": str(t["read_queue_nums"]),
                            "writeQueueNums": str(t["write_queue_nums"]),
                            "perm": str(t["perm"]),
                            "topicFilterType": "SINGLE_TAG",
                            "topicSysFlag": "0",
                            "order": "true" if t["order"] else "false",
                        },
                    ),
                )
                (report.created_topics if cur is None else report.updated_topics).append(name)
        for name in have:
            if name not in want and _TENANT_RESOURCE.match(name):
                await self._call(addr, RemotingCommand(RequestCode.DELETE_TOPIC_IN_BROKER, ext_fields={"topic": name}))
                report.deleted_topics.append(name)
        # Subscription groups
        have_groups = (await self._call_json(addr, RemotingCommand(RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG))).get(
            "subscriptionGroupTable", {}
        )
        want_groups = {g["name"]: g for g in desired["groups"]}
        for name, g in want_groups.items():
            cur = have_groups.get(name)
            body = _group_config(g)
            if cur is None or any(cur.get(k) != v for k, v in body.items()):
                await self._call(
                    addr, RemotingCommand(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, body=bodies.dumps(body))
                )
                report.created_groups.append(name)
        for name in have_groups:
            if name not in want_groups and _TENANT_RESOURCE.match(name):
                await self._call(
                    addr, RemotingCommand(RequestCode.DELETE_SUBSCRIPTIONGROUP, ext_fields={"groupName": name})
                )
                report.deleted_groups.append(name)
        # Credentials, tenants and quota shares: the whole snapshot
        tenancy = desired["tenancy"]
        await self._call(addr, RemotingCommand(RequestCode.ORBIT_SYNC_TENANCY, body=orjson.dumps(tenancy)))
        report.tenancy_version = int(tenancy.get("version", 0))

    async def _reconcile_namesrvs(
        self, targets: Sequence[BrokerTarget], desired: dict[str, DesiredBrokerState]
    ) -> None:
        """Each name server gets the access keys and the fleet of the broker groups that list it."""
        served: dict[str, list[BrokerTarget]] = {}
        for t in targets:
            for addr in t.namesrv_addrs:
                served.setdefault(addr, []).append(t)

        async def one(addr: str, groups: list[BrokerTarget]) -> None:
            creds: dict[str, Any] = {}
            version = 0
            for t in groups:
                tenancy = desired[t.group]["tenancy"] if t.group in desired else None
                if tenancy is None:  # its desired state could not be read: try again next round
                    self.namesrv_errors[addr] = f"no desired state for broker group {t.group}"
                    return
                version = max(version, int(tenancy.get("version", 0)))
                for c in tenancy.get("credentials", []):
                    creds[c["access_key"]] = c
            snapshot = {
                "version": version,
                "credentials": list(creds.values()),
                "fleet": {t.group: list(t.addrs) for t in groups},
            }
            try:
                await self._call(addr, RemotingCommand(RequestCode.ORBIT_SYNC_TENANCY, body=orjson.dumps(snapshot)))
            except (ReconcileError, RemotingError) as e:
                self.namesrv_errors[addr] = str(e)
                log.warning("syncing name server %s failed: %s", addr, e)
            else:
                self.namesrv_errors.pop(addr, None)

        await asyncio.gather(*(one(a, g) for a, g in served.items()))

    # --- requests ---------------------------------------------------------------------------------
    async def _call(self, addr: str, cmd: RemotingCommand) -> RemotingCommand:
        cmd.ext_fields = {**(cmd.ext_fields or {}), "Authorization": f"Bearer {await self._token()}"}
        resp = await self.client.invoke(addr, cmd, self.timeout_ms)
        if resp.code != ResponseCode.SUCCESS:
            raise ReconcileError(f"request {cmd.code} answered {resp.code}: {resp.remark}")
        return resp

    async def _call_json(self, addr: str, cmd: RemotingCommand) -> dict[str, Any]:
        resp = await self._call(addr, cmd)
        return bodies.loads_object(resp.body_bytes())


def _topic_differs(cur: dict[str, Any], t: DesiredTopic) -> bool:
    return (
        int(cur.get("readQueueNums", -1)) != t["read_queue_nums"]
        or int(cur.get("writeQueueNums", -1)) != t["write_queue_nums"]
        or int(cur.get("perm", -1)) != t["perm"]
        or bool(cur.get("order", False)) != t["order"]
    )


def _group_config(g: DesiredGroup) -> dict[str, Any]:
    return {
        "groupName": g["name"],
        "consumeEnable": True,
        "consumeFromMinEnable": True,
        "consumeBroadcastEnable": True,
        "retryQueueNums": 1,
        "retryMaxTimes": g["retry_max_times"],
        "brokerId": 0,
        "whichBrokerWhenConsumeSlowly": 1,
        "notifyConsumerIdsChangedEnable": True,
        "consumeMessageOrderly": g["consume_orderly"],
    }


def tenancy_version() -> int:
    """A version for a tenancy snapshot: later snapshots carry larger numbers."""
    return time.time_ns() // 1000
