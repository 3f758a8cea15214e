"""PartitionCluster: a broker group of two members (ids 0 and 1) with automatic failover, every
member's three network paths behind a PathProxy of its own.

    member m ── control_plane_url = http://<cp proxy m> ──▶ control plane ──▶ PostgreSQL
             ◀─ HA: the other member connects to <ha proxy m> ──▶ m's fixed HA port
             ◀─ clients: name servers hand out <client proxy m> ──▶ m's fixed client port

- The control plane is a child process (``orbit control-plane``) over the PostgreSQL it is given
  (``database_url``: the test tier's server) or, without one, an embedded PostgreSQL of its own
  under the cluster's directory (the benchmark's way, as ``orbit dev up`` runs it).
- Each member binds a fixed client port and a fixed HA port picked once (free ports), so its
  proxies' targets stay valid across promotions, demotions and restarts; it publishes the
  proxies' addresses (``advertised_port``, ``ha_advertised``), so producers and the other member
  reach it only through them. The name server is not proxied.
- SYNC_MASTER + SYNC_FLUSH, the lease settings given (the defaults: lease 6 s, check 1 s), an HA
  link authenticated by a shared ``ha_secret_file``, registrations every 2 s.
- ``kill(m)`` is kill -9; ``start_member(m)`` starts it again on the same store and flags.

Addresses: ``real_addr(m)`` (the broker's own port: the harness's monitor and reads go there)
and ``client_addr(m)`` (its client proxy: what producers use).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import enum
import json
import os
import secrets
import shutil
import socket
import tempfile
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from data_plane.local_cluster import Child, spawn
from loadtest.partition.proxy import PathProxy

HOST = "127.0.0.1"
GROUP = "broker-a"
CLUSTER = "DefaultCluster"
MEMBERS = (0, 1)
# Test-sized store files: 16 MiB CommitLog files, nothing reserved ahead, small indexes.
SMALL_STORE = (
    "--store-set", "commit_log_file_size_bytes=16777216",
    "--store-set", "reserve_ahead_bytes=0",
    "--store-set", "index_hash_slots=65536",
    "--store-set", "index_max_entries=262144",
)  # fmt: skip


class NetPath(enum.Enum):
    """A member's network paths."""

    CONTROL_PLANE = "cp"
    HA = "ha"
    CLIENT = "client"


@dataclass(frozen=True)
class ClusterOptions:
    lease_s: float = 6.0  # failover_lease_s
    check_s: float = 1.0  # failover_check_interval_s
    ha_sync_timeout_ms: int = 2000
    register_interval_s: float = 2.0
    flush: str = "SYNC_FLUSH"
    database_url: str = ""  # "": an embedded PostgreSQL under the cluster's directory
    extra_broker_flags: tuple[str, ...] = ()


def free_port() -> int:
    """A port nothing listens on now (bound and released; taken again by the member at once)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def _read_json(path: str) -> dict[str, Any]:
    with open(path) as f:
        return dict(json.load(f))


class OperatorClient:
    """The control plane's operator API over aiohttp, logging in again when the token expires."""

    def __init__(self, url: str, access_key: str, secret: str) -> None:
        self.url = url.rstrip("/")
        self._basic = base64.b64encode(f"{access_key}:{secret}".encode()).decode()
        self._token = ""
        self._session: aiohttp.ClientSession | None = None

    async def _login(self) -> None:
        assert self._session is not None
        async with self._session.post(
            self.url + "/oauth/token",
            data={"grant_type": "client_credentials"},
            headers={"Authorization": f"Basic {self._basic}"},
        ) as resp:
            body = await resp.json()
            if resp.status != 200:
                raise RuntimeError(f"the control plane refused the operator credential: {resp.status} {body}")
            self._token = str(body["access_token"])

    async def call(self, method: str, path: str, body: Any = None, *, timeout_s: float = 5.0) -> tuple[int, Any]:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s))
        for attempt in range(2):
            if not self._token:
                await self._login()
            async with self._session.request(
                method, self.url + path, json=body, headers={"Authorization": f"Bearer {self._token}"}
            ) as resp:
                if resp.status == 401 and attempt == 0:
                    self._token = ""
                    continue
                data = await resp.json() if resp.content_type == "application/json" else await resp.read()
                return resp.status, data
        raise AssertionError("unreachable")

    async def fleet_ha(self) -> dict[str, Any] | None:
        """This cluster's group in ``GET /v1/fleet/ha`` (None before any member called in)."""
        status, body = await self.call("GET", "/v1/fleet/ha", timeout_s=2.0)
        if status != 200:
            raise RuntimeError(f"GET /v1/fleet/ha: {status} {body!r}")
        for g in body.get("broker_groups", []):
            if g.get("broker_name") == GROUP and g.get("cluster") == CLUSTER:
                return dict(g)
        return None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


@dataclass
class Member:
    member_id: int
    client_port: int
    ha_port: int
    store_dir: str
    proxies: dict[NetPath, PathProxy] = field(default_factory=dict)
    child: Child | None = None
    starts: int = 0

    @property
    def alive(self) -> bool:
        return self.child is not None and self.child.proc.poll() is None


class PartitionCluster:
    def __init__(self, root: str | None = None, options: ClusterOptions | None = None) -> None:
        self.options = options or ClusterOptions()
        self._own_root = root is None
        self.root = root or tempfile.mkdtemp(prefix="orbit-partition-")
        self.keep = False  # keep a directory of its own (the members' logs) after stop()
        self.run_dir = os.path.join(self.root, "run")
        self.children: list[Child] = []
        self.members: dict[int, Member] = {}
        self.namesrv = ""
        self.control_plane_url = ""
        self.operator: OperatorClient | None = None
        self._cp_port = 0
        self._credentials_file = os.path.join(self.root, "broker-credentials.json")
        self._secret_file = os.path.join(self.root, "ha.secret")

    # --- life cycle -----------------------------------------------------------------------------
    async def start(self) -> PartitionCluster:
        try:
            await self._start_control_plane()
            ns = await asyncio.to_thread(spawn, "namesrv", "namesrv", ["--listen", f"{HOST}:0"], self.run_dir,
                                         new_session=False)  # fmt: skip
            self.children.append(ns)
            self.namesrv = ns.address
            await self._make_broker_credential()
            fd = os.open(self._secret_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_urlsafe(32))
            for m in MEMBERS:
                member = Member(m, free_port(), free_port(), os.path.join(self.root, f"member-{m}"))
                member.proxies = {
                    NetPath.CONTROL_PLANE: PathProxy(f"m{m}-cp", HOST, self._cp_port),
                    NetPath.HA: PathProxy(f"m{m}-ha", HOST, member.ha_port),
                    NetPath.CLIENT: PathProxy(f"m{m}-client", HOST, member.client_port),
                }
                for p in member.proxies.values():
                    await p.start()
                self.members[m] = member
            await self.start_member(0)
            await self.start_member(1)
        except BaseException:
            await self.stop()
            raise
        return self

    async def _start_control_plane(self) -> None:
        cp_dir = os.path.join(self.root, "control-plane")
        operator_file = os.path.join(cp_dir, "operator.json")
        args = ["--listen", f"{HOST}:0", "--data-dir", cp_dir, "--bootstrap-credentials-file", operator_file,
                "--reconcile-interval-s", "0"]  # fmt: skip
        if self.options.database_url:
            args += ["--database-url", self.options.database_url]
        cp = await asyncio.to_thread(spawn, "control-plane", "control-plane", args, self.run_dir, new_session=False)
        self.children.append(cp)
        self.control_plane_url = str(cp.info["url"])
        self._cp_port = int(self.control_plane_url.rpartition(":")[2])
        op = await asyncio.to_thread(_read_json, operator_file)
        self.operator = OperatorClient(self.control_plane_url, op["access_key"], op["secret"])

    async def _make_broker_credential(self) -> None:
        assert self.operator is not None
        status, made = await self.operator.call("POST", "/v1/admin/credentials", {"role": "broker"})
        if status != 201:
            raise RuntimeError(f"could not make a broker credential: {status} {made!r}")
        fd = os.open(self._credentials_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({"access_key": made["access_key"], "secret": made["secret"]}, f)

    async def stop(self) -> None:
        for m in self.members.values():
            if m.child is not None:
                await asyncio.to_thread(m.child.stop, 15.0)
        for c in reversed(self.children):
            await asyncio.to_thread(c.stop, 15.0)
        for m in self.members.values():
            for p in m.proxies.values():
                await p.close()
        if self.operator is not None:
            await self.operator.close()
        if self._own_root and not self.keep:
            shutil.rmtree(self.root, ignore_errors=True)

    # --- members ------------------------------------------------------------------------------------
    def broker_args(self, m: int) -> list[str]:
        o = self.options
        member = self.members[m]
        px = member.proxies
        return [
            "--listen", f"{HOST}:{member.client_port}",
            "--namesrv", self.namesrv,
            "--broker-name", GROUP,
            "--store-dir", member.store_dir,
            "--role", "SLAVE" if m else "SYNC_MASTER", "--broker-id", str(m),
            "--flush", o.flush,
            *SMALL_STORE,
            "--set", f"ha_listen={HOST}:{member.ha_port}",
            "--set", f"advertised_port={px[NetPath.CLIENT].port}",
            "--set", f"ha_advertised={px[NetPath.HA].address}",
            "--set", f"control_plane_url=http://{px[NetPath.CONTROL_PLANE].address}",
            "--set", f"broker_credentials_file={self._credentials_file}",
            "--set", f"ha_secret_file={self._secret_file}",
            "--set", "failover_enabled=true",
            "--set", f"failover_lease_s={o.lease_s}",
            "--set", f"failover_check_interval_s={o.check_s}",
            "--set", f"ha_sync_timeout_ms={o.ha_sync_timeout_ms}",
            "--set", f"register_interval_s={o.register_interval_s}",
            *o.extra_broker_flags,
        ]  # fmt: skip

    async def start_member(self, m: int) -> None:
        member = self.members[m]
        if member.alive:
            return
        name = f"member-{m}"
        member.child = await asyncio.to_thread(spawn, "broker", name, self.broker_args(m), self.run_dir,
                                               new_session=False)  # fmt: skip
        member.starts += 1

    def kill(self, m: int) -> None:
        """kill -9: no shutdown at all."""
        child = self.members[m].child
        if child is not None and child.proc.poll() is None:
            child.proc.kill()
            child.proc.wait()

    def proxy(self, m: int, path: NetPath) -> PathProxy:
        return self.members[m].proxies[path]

    def heal_all(self) -> None:
        for member in self.members.values():
            for p in member.proxies.values():
                p.heal()

    def real_addr(self, m: int) -> str:
        return f"{HOST}:{self.members[m].client_port}"

    def client_addr(self, m: int) -> str:
        return self.proxy(m, NetPath.CLIENT).address

    def member_of_store_port(self, port: int) -> int | None:
        """The member whose published client port (its client proxy's) is ``port``: message ids
        carry it as the store host."""
        for m, member in self.members.items():
            if member.proxies[NetPath.CLIENT].port == port:
                return m
        return None

    def log_tail(self, m: int, chars: int = 3000) -> str:
        child = self.members[m].child
        if child is None:
            return ""
        with contextlib.suppress(OSError), open(child.log_path, errors="replace") as f:
            return f.read()[-chars:]
        return ""
