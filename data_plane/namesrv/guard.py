"""NamesrvGuard: who may talk to the name servers of a multi-tenant cluster, and what they may do.

Routes decide where tenants' clients send their messages and their credentials, so a name server
of a multi-tenant cluster (``orbit namesrv --tenancy``) checks every request before its handler::

    request ─▶ Authorizer.check ─▶ role ─▶ fleet (registrations) ─▶ handler
               (a JWT against the control plane's JWKS, or a RocketMQ ACL signature against the
                access keys the control plane sends; the request → permission table of
                data_plane/auth/request_access.py)

    REGISTER_BROKER (103)         a credential of role broker, from a host the fleet lists for that
                                  broker group, with a brokerAddr on such a host (clients are
                                  never routed off the fleet's hosts; the port may change)
                                  (a credential the control plane bound to one host of
                                  one group — per-host broker credentials — registers only
                                  that group, from that host)
    UNREGISTER_BROKER (104)       the same, or an operator
    GET_ROUTEINFO_BY_TOPIC (105)  a credential of the topic's tenant (any grant), an operator or a
                                  broker; TBW102: any credential
    GET_BROKER_CLUSTER_INFO (106), the topic list (206), DELETE_TOPIC_IN_NAMESRV (216):
                                  operators and brokers
    ORBIT_SYNC_TENANCY (9001)     operators (the control plane's reconciler)

The fleet and the access keys come from the control plane's reconciler (ORBIT_SYNC_TENANCY with
``{"version", "credentials", "fleet": {group: [broker address, …]}}``) and are kept under the
name server's state directory (the access keys encrypted, as on brokers), so a restarted name
server checks registrations at once. Until the first snapshot, registrations are refused (the
brokers retry every second). Every refusal is counted by reason (``refused``) and logged as one
line with the source address (``data_plane/refusal_log.py``: rate-limited per reason); no token,
signature or secret is logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import socket
from collections import Counter
from collections.abc import Awaitable, Iterable, Mapping
from typing import Any, Final

import orjson

from data_plane.auth import Authorizer, CredentialEntry, Denial, Principal
from data_plane.auth.files import write_atomic
from data_plane.refusal_log import RefusalLog
from data_plane.remoting.codes import RequestCode, ResponseCode
from data_plane.remoting.command import RemotingCommand
from data_plane.remoting.connection import Connection

log = logging.getLogger(__name__)

FLEET_FILE: Final = "fleet.json"
MAX_FLEET_GROUPS: Final = 10_000
MAX_GROUP_ADDRS: Final = 64
MAX_NAME_LENGTH: Final = 255


class FleetError(ValueError):
    """A fleet document that cannot be used; the message says why."""


def parse_fleet(doc: object) -> dict[str, tuple[str, ...]]:
    """``{group: [host:port, …]}`` checked: names and addresses are bounded strings."""
    if not isinstance(doc, dict):
        raise FleetError("fleet must be an object of broker group → broker addresses")
    if len(doc) > MAX_FLEET_GROUPS:
        raise FleetError(f"fleet lists {len(doc)} broker groups, more than {MAX_FLEET_GROUPS}")
    out: dict[str, tuple[str, ...]] = {}
    for group, addrs in doc.items():
        if not isinstance(group, str) or not 0 < len(group) <= MAX_NAME_LENGTH:
            raise FleetError(f"fleet: bad broker group name {str(group)[:60]!r}")
        if not isinstance(addrs, list) or len(addrs) > MAX_GROUP_ADDRS:
            raise FleetError(f"fleet: {group}'s addresses must be a list of at most {MAX_GROUP_ADDRS}")
        for addr in addrs:
            host, sep, port = addr.rpartition(":") if isinstance(addr, str) else ("", "", "")
            if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536 or len(addr) > 300:
                raise FleetError(f"fleet: {group} lists {str(addr)[:60]!r}, not host:port")
        out[group] = tuple(addrs)
    return out


def _host(addr: str) -> str:
    host = addr.rpartition(":")[0]
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def resolve_hosts(addrs: Iterable[str]) -> frozenset[str]:
    """The hosts of ``addrs`` and, for names, the addresses they resolve to (blocking: run it in a
    thread). A name that does not resolve counts as itself only."""
    hosts: set[str] = set()
    for addr in addrs:
        host = _host(addr)
        hosts.add(host)
        try:
            ipaddress.ip_address(host)
        except ValueError:
            with contextlib.suppress(OSError):
                hosts.update(str(info[4][0]) for info in socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP))
    return frozenset(hosts)


def _resolve(
    fleet: Mapping[str, tuple[str, ...]], bound: Mapping[str, tuple[str, str]]
) -> tuple[dict[str, frozenset[str]], dict[str, tuple[str, frozenset[str]]]]:
    """Each group's hosts, and each bound credential's group and host addresses (blocking)."""
    by_host = {h: resolve_hosts([f"[{h}]:0" if ":" in h else f"{h}:0"]) for _g, h in bound.values()}
    return {g: resolve_hosts(a) for g, a in fleet.items()}, {ak: (g, by_host[h]) for ak, (g, h) in bound.items()}


class NamesrvGuard:
    def __init__(self, auth: Authorizer, *, state_dir: str | None = None) -> None:
        self.auth = auth
        self.state_dir = state_dir
        self.version = -1
        self.fleet: dict[str, frozenset[str]] = {}  # group → the broker addresses listed
        self.fleet_hosts: dict[str, frozenset[str]] = {}  # group → hosts they may register from
        # A broker credential bound to one host of one group (the control plane's per-host
        # credentials): access key → (group, the host's addresses).
        self.bindings: dict[str, tuple[str, frozenset[str]]] = {}
        self.refused: Counter[str] = Counter()  # reason → refusals
        self._log = RefusalLog(log, "requests refused", counts=self.refused)

    # --- life cycle ---------------------------------------------------------------------------------
    async def start(self) -> None:
        await self.auth.start()
        if self.state_dir:
            await asyncio.to_thread(self._load_fleet)

    async def stop(self) -> None:
        await self.auth.stop()

    def _fleet_path(self) -> str | None:
        return os.path.join(self.state_dir, FLEET_FILE) if self.state_dir else None

    def _load_fleet(self) -> None:
        path = self._fleet_path()
        if path is None:
            return
        try:
            with open(path, "rb") as f:
                doc = orjson.loads(f.read())
            fleet = parse_fleet(doc.get("fleet"))
            version = int(doc.get("version", -1))
            bound = {str(ak): (str(g), str(h)) for ak, (g, h) in (doc.get("bindings") or {}).items()}
        except FileNotFoundError:
            return
        except (OSError, ValueError, AttributeError, TypeError) as e:
            log.warning("the kept fleet %s is not usable (%s): registrations wait for the control plane", path, e)
            return
        hosts, self.bindings = _resolve(fleet, bound)
        self._set_fleet(fleet, hosts, version)

    def _set_fleet(self, fleet: Mapping[str, tuple[str, ...]], hosts: dict[str, frozenset[str]], version: int) -> None:
        self.fleet = {g: frozenset(a) for g, a in fleet.items()}
        self.fleet_hosts = hosts
        self.version = version

    # --- the check ahead of every handler --------------------------------------------------------------
    def before(
        self, conn: Connection, cmd: RemotingCommand
    ) -> RemotingCommand | Awaitable[RemotingCommand | None] | None:
        r = self.auth.check(cmd)
        if isinstance(r, Principal):
            return self._admit(conn, r, cmd)
        if isinstance(r, Denial):
            return self._refuse(conn, cmd, "credentials", r.remark)
        return self._admit_later(conn, r, cmd)

    async def _admit_later(
        self, conn: Connection, pending: Awaitable[Principal | Denial], cmd: RemotingCommand
    ) -> RemotingCommand | None:
        r = await pending
        if isinstance(r, Denial):
            return self._refuse(conn, cmd, "credentials", r.remark)
        return self._admit(conn, r, cmd)

    def _admit(self, conn: Connection, principal: Principal, cmd: RemotingCommand) -> RemotingCommand | None:
        code = cmd.code
        if code == RequestCode.REGISTER_BROKER:
            if principal.role != "broker":
                return self._refuse(conn, cmd, "role", "registering a broker takes a broker credential")
            return self._check_binding(conn, cmd, principal) or self._check_fleet(conn, cmd)
        if code == RequestCode.UNREGISTER_BROKER:
            if principal.role == "operator":
                return None
            if principal.role != "broker":
                return self._refuse(conn, cmd, "role", "unregistering a broker takes a broker or operator credential")
            return self._check_binding(conn, cmd, principal) or self._check_fleet(conn, cmd)
        if code == RequestCode.ORBIT_SYNC_TENANCY and principal.role != "operator":
            return self._refuse(conn, cmd, "role", "the tenancy snapshot comes from the control plane (operators)")
        return None

    def _check_binding(self, conn: Connection, cmd: RemotingCommand, principal: Principal) -> RemotingCommand | None:
        """A credential bound to one host of one group registers that group, from that host."""
        bound = self.bindings.get(principal.subject)
        if bound is None:
            return None
        group, hosts = bound
        asked = (cmd.ext_fields or {}).get("brokerName", "")
        if asked != group:
            why = f"this credential is bound to broker group {group!r}, not {asked[:80]!r}"
            return self._refuse(conn, cmd, "binding", why)
        host = _host(conn.peer)
        if host not in hosts:
            return self._refuse(conn, cmd, "binding", f"this credential is bound to another host than {host}")
        return None

    def _check_fleet(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand | None:
        ext = cmd.ext_fields or {}
        group = ext.get("brokerName", "")
        addr = ext.get("brokerAddr", "")
        listed = self.fleet.get(group)
        if listed is None:
            why = "has no fleet from the control plane yet" if self.version < 0 else "is not in the fleet"
            return self._refuse(conn, cmd, "fleet", f"broker group {group[:80]!r} {why}")
        host = _host(conn.peer)
        if host not in self.fleet_hosts.get(group, frozenset()):
            return self._refuse(
                conn, cmd, "fleet", f"host {host} is not one the fleet lists for broker group {group[:80]!r}"
            )
        if addr not in listed and _host(addr) not in self.fleet_hosts.get(group, frozenset()):
            why = f"brokerAddr {addr[:80]!r} is not on a host the fleet lists for broker group {group[:80]!r}"
            return self._refuse(conn, cmd, "fleet", why)
        return None

    def _refuse(self, conn: Connection, cmd: RemotingCommand, reason: str, remark: str) -> RemotingCommand:
        self._log(reason, "refused request %d from %s (%s): %s", cmd.code, conn.peer, reason, remark)
        return cmd.response(ResponseCode.NO_PERMISSION, remark)

    # --- ORBIT_SYNC_TENANCY -----------------------------------------------------------------------------
    async def sync(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        """The control plane's snapshot: access keys and the fleet (older versions are ignored)."""
        try:
            doc: Any = orjson.loads(cmd.body_bytes())
            if not isinstance(doc, dict):
                raise FleetError("the snapshot must be a JSON object")
            version = doc.get("version")
            if not isinstance(version, int) or isinstance(version, bool) or version < 0:
                raise FleetError("the snapshot needs a non-negative integer version")
            creds = doc.get("credentials")
            if not isinstance(creds, list):
                raise FleetError("credentials must be a list")
            fleet = parse_fleet(doc.get("fleet"))
        except (orjson.JSONDecodeError, FleetError) as e:
            return cmd.response(ResponseCode.SYSTEM_ERROR, f"tenancy snapshot: {e}")
        if version < self.version:
            return cmd.response(ResponseCode.SUCCESS, f"version {version} is older than {self.version}")
        store = self.auth.credentials
        if store is not None:
            try:
                entries: list[CredentialEntry] = creds
                await store.apply(entries, version)
            except (ValueError, TypeError, KeyError) as e:
                return cmd.response(ResponseCode.SYSTEM_ERROR, f"credentials: {e}")
        bound = {
            str(c["access_key"]): (str(c["broker_group"]), str(c["host"]))
            for c in creds
            if isinstance(c, dict) and isinstance(c.get("host"), str) and isinstance(c.get("broker_group"), str)
        }

        hosts, bindings = await asyncio.to_thread(_resolve, fleet, bound)
        self._set_fleet(fleet, hosts, version)
        self.bindings = bindings
        path = self._fleet_path()
        if path is not None:
            data = orjson.dumps(
                {"version": version, "fleet": {g: list(a) for g, a in fleet.items()}, "bindings": bound}
            )
            await asyncio.to_thread(write_atomic, path, data)
        return cmd.response(ResponseCode.SUCCESS)
