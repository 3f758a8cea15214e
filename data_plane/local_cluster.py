"""LocalCluster: a name server and brokers as child processes on this machine, all state under
one directory. ``orbit dev up`` runs one in the foreground; benchmarks start one per run.

With ``tenancy`` the cluster is the managed service in miniature: the control plane starts first
(with an embedded PostgreSQL under ``<root>/control-plane``), the broker runs with
authentication on and reports usage with a credential of its own, the broker group is
registered, and a demo tenant is made (``data_plane/dev_tenancy.py``).

With ``slaves`` > 0 the broker group is a SYNC_MASTER (``master_role``) and that many slaves
(``broker-a-s1``, ...; listen port = broker port + 10 x n); with tenancy on too, the group fails
over automatically through the control plane's leases (docs/ha.md).

With ``broker_groups`` > 1 there are that many such groups, ``broker-a``, ``broker-b``, ... (each
member's store under ``<root>/<member name>``), every one registered with the control plane's
fleet with a broker credential of its own. Ports: group ``broker-a`` as above; each further group
takes the next free block after the previous group's ports (``group_ports.py``); with port 0
every member takes a free port.

With ``tier`` the brokers tier their sealed CommitLog files to a local S3-compatible store
(``data_plane/local_object_store.py``, started first, stopped last, empty at every start): bucket
``orbit-tier``, prefix the cluster's name, short retention (``TIER_STORE_SETTINGS``), and the
store's dummy credentials in the brokers' environment.

Each child is ``python -m data_plane.cli <namesrv|broker> ... --ready-file F``; a child is up
once F holds its address. Stopping sends SIGTERM to brokers first (they unregister and flush),
then to the name server, and waits."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from data_plane.broker.config import BrokerConfig
from data_plane.dev_tenancy import (
    BootstrapError,
    Demo,
    ensure_broker_credential,
    ensure_broker_group,
    ensure_demo,
    operator_api,
)
from data_plane.group_ports import MEMBER_PORT_STEP, group_name, next_free_base
from data_plane.tls import CA_FILE, CERT_FILE, KEY_FILE, make_local_ca

if TYPE_CHECKING:
    from data_plane.local_object_store import LocalObjectStore

READY_TIMEOUT_S = 60.0
TIER_BUCKET = "orbit-tier"
# Short enough to watch locally: a sealed file goes to the bucket after ~36 s and its local copy
# is deleted after 6 minutes (then reads of it go to the bucket). --store-set overrides them.
# Small CommitLog files (8 MiB, twice the largest message) so that files seal, are uploaded and
# leave local disk within minutes of trying it: uploaded once sealed, local copies kept 6 min,
# retention rounds every 10 s.
TIER_STORE_SETTINGS: dict[str, float] = {
    "commit_log_file_size_bytes": 8 * 1024 * 1024,
    "tier_after_hours": 0.0,
    "local_retention_hours": 0.1,
    "tier_check_interval_ms": 5_000,
}


def tier_store_settings(endpoint_url: str, *, region: str, cluster_name: str) -> dict[str, str | float]:
    """The ``[store]`` settings that point a broker of ``cluster_name`` at the bucket
    ``TIER_BUCKET`` of the S3-compatible store at ``endpoint_url``."""
    return {
        "tier_url": f"s3://{TIER_BUCKET}/{cluster_name}",
        "tier_endpoint_url": endpoint_url,
        "tier_region": region,
        **TIER_STORE_SETTINGS,
    }


class ClusterError(RuntimeError):
    """A child did not start; the message ends with its log's tail."""


@dataclass
class Child:
    name: str
    proc: subprocess.Popen[bytes]
    info: dict[str, Any]
    log_path: str

    @property
    def address(self) -> str:
        return str(self.info["address"])

    def stop(self, timeout_s: float = 30.0) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def spawn(
    kind: str,
    name: str,
    args: list[str],
    run_dir: str,
    *,
    new_session: bool = True,
    env: Mapping[str, str] | None = None,
) -> Child:
    """Start ``orbit <kind> <args>`` (in ``env``, else this process's environment) and wait
    until it serves."""
    os.makedirs(run_dir, exist_ok=True)
    ready = os.path.join(run_dir, f"{name}.ready")
    if os.path.exists(ready):
        os.unlink(ready)
    log_path = os.path.join(run_dir, f"{name}.log")
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "data_plane.cli", kind, *args, "--ready-file", ready],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=new_session,  # Ctrl-C reaches the parent only; it stops children in order
            env=env,
        )
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        if os.path.exists(ready):
            with open(ready) as f:
                return Child(name, proc, json.load(f), log_path)
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    with open(log_path, errors="replace") as f:
        tail = f.read()[-3000:]
    raise ClusterError(f"{name} did not start; the end of {log_path}:\n{tail}")


@dataclass
class LocalCluster:
    root: str
    host: str = "127.0.0.1"
    namesrv_port: int = 9876
    broker_port: int = 10911
    # The first slave's port (the next ones 10 apart); None: the master's port + 10, 0: free ports.
    slave_port: int | None = None
    flush: str = "ASYNC_FLUSH"
    broker_flags: list[str] = field(default_factory=list)
    tenancy: bool = False
    slaves: int = 0
    broker_groups: int = 1  # broker-a, broker-b, ...: each a master and ``slaves`` slaves
    master_role: str = "SYNC_MASTER"
    failover: bool = True  # with tenancy and slaves
    control_plane_port: int = 8080
    children: list[Child] = field(default_factory=list)
    control_plane_url: str = ""
    demo: Demo | None = None
    # TLS everywhere (a local CA under <root>/tls): the name server and brokers in permissive mode
    # (TLS and plain on one port: stock clients without TLS still connect), the control plane on HTTPS.
    tls: bool = False
    tls_files: dict[str, str] = field(default_factory=dict)
    # Tiered storage to a local S3-compatible store (see the module's docstring).
    tier: bool = False
    object_store: LocalObjectStore | None = None
    tier_settings: dict[str, str | float] = field(default_factory=dict)  # [store] settings of every broker
    broker_env: dict[str, str] | None = None  # None: this process's environment
    # Added to the control plane's environment (its ORBIT_* settings: the autoscaler's, say).
    control_plane_env: dict[str, str] = field(default_factory=dict)
    _env_before: str | None = None
    _group_bases: dict[int, int] = field(default_factory=dict)  # group (> 0) -> its master's port

    @property
    def run_dir(self) -> str:
        return os.path.join(self.root, "run")

    def start(self) -> LocalCluster:
        try:
            if self.tier:
                self.start_object_store()
            api = None
            ns_tls: list[str] = []
            cp_tls: list[str] = []
            if self.tls:
                self.tls_files = make_local_ca(os.path.join(self.root, "tls"))
                cert, key, ca = self.tls_files[CERT_FILE], self.tls_files[KEY_FILE], self.tls_files[CA_FILE]
                # Children (and clients this process starts) verify the control plane's HTTPS and the
                # servers by this CA (data_plane/tls.py) until the cluster stops.
                self._env_before = os.environ.get("ORBIT_TLS_CA")
                os.environ["ORBIT_TLS_CA"] = ca
                ns_tls = ["--tls-mode", "permissive", "--tls-cert", cert, "--tls-key", key]
                cp_tls = ["--tls-cert", cert, "--tls-key", key]
                self.broker_flags = [
                    *self.broker_flags,
                    *("--set", "tls_mode=permissive", "--set", f"tls_cert_file={cert}"),
                    *("--set", f"tls_key_file={key}", "--set", f"tls_ca_file={ca}"),
                ]
            if self.tenancy:
                cp_dir = os.path.join(self.root, "control-plane")
                operator_file = os.path.join(cp_dir, "operator.json")
                cp = spawn(
                    "control-plane",
                    "control-plane",
                    [
                        "--listen",
                        f"{self.host}:{self.control_plane_port}",
                        "--data-dir",
                        cp_dir,
                        "--bootstrap-credentials-file",
                        operator_file,
                        "--reconcile-interval-s",
                        "2",
                        *cp_tls,
                    ],
                    self.run_dir,
                    env={**os.environ, **self.control_plane_env} if self.control_plane_env else None,
                )
                self.children.append(cp)
                self.control_plane_url = str(cp.info["url"])
                api = operator_api(self.control_plane_url, operator_file)
            ns_args = ["--listen", f"{self.host}:{self.namesrv_port}", *ns_tls]
            if self.tenancy:  # it checks credentials: the control plane's keys, and what its reconciler sends
                ns_args += ["--tenancy", "--control-plane-url", self.control_plane_url,
                            "--state-dir", os.path.join(self.root, "namesrv")]  # fmt: skip
            ns = spawn("namesrv", "namesrv", ns_args, self.run_dir)
            self.children.append(ns)
            for group in range(self.broker_groups):
                name = group_name(group)
                tenancy_flags: list[str] = []
                if api is not None:  # each group reports usage with a credential of its own
                    broker_creds = os.path.join(self.root, name, "broker-credentials.json")
                    ensure_broker_credential(api, broker_creds)
                    tenancy_flags = [
                        "--set", "auth_enabled=true",
                        "--set", f"control_plane_url={self.control_plane_url}",
                        "--set", f"broker_credentials_file={broker_creds}",
                    ]  # fmt: skip
                if group and self.broker_port:
                    try:
                        base = next_free_base(self._last_port(group - 1), self.slaves + 1, self.host)
                    except OSError as e:
                        raise ClusterError(f"{name} did not start: {e}") from None
                    self._group_bases[group] = base
                members: list[Child] = []
                # Each member kept as it starts: a later failure stops it.
                for i, member in enumerate(self.member_names(group)):
                    args = self.broker_args(i, ns.address, tenancy_flags, group=group)
                    members.append(spawn("broker", member, args, self.run_dir, env=self.broker_env))
                    self.children.append(members[-1])
                if api is not None:
                    ensure_broker_group(api, name, [m.address for m in members], ns.address)
            if api is not None:
                self.demo = ensure_demo(api, os.path.join(self.root, "demo-credentials.json"))
        except (ClusterError, BootstrapError):
            self.stop()
            raise
        return self

    def start_object_store(self) -> None:
        """Start the local S3-compatible store with the bucket ``TIER_BUCKET``, and set what the
        brokers get from it: ``tier_settings`` and ``broker_env``."""
        from data_plane.local_object_store import LocalObjectStore, LocalObjectStoreError

        # On 127.0.0.1 whatever --host is: only the brokers on this machine use it.
        store = self.object_store = LocalObjectStore(os.path.join(self.run_dir, "object-store.log"))
        try:
            store.start()
            store.create_bucket(TIER_BUCKET)
        except LocalObjectStoreError as e:
            raise ClusterError(f"object-store did not start: {e}") from None
        cluster_name = BrokerConfig().cluster_name  # the brokers' (LocalCluster does not name its own)
        self.tier_settings = tier_store_settings(store.endpoint_url, region=store.region, cluster_name=cluster_name)
        self.broker_env = store.environment()

    @property
    def tier_url(self) -> str:
        return str(self.tier_settings.get("tier_url", ""))

    @property
    def broker_names(self) -> list[str]:
        """The members of group broker-a: its master, then its slaves."""
        return self.member_names(0)

    def member_names(self, group: int) -> list[str]:
        """The members of broker group ``group`` (0: broker-a): its master, then its slaves."""
        name = group_name(group)
        return [name, *(f"{name}-s{i}" for i in range(1, self.slaves + 1))]

    @property
    def group_names(self) -> list[str]:
        return [group_name(g) for g in range(self.broker_groups)]

    def member_port(self, member: int, group: int = 0) -> int:
        """The port member ``member`` (0: the master) of broker group ``group`` listens on (0: a
        free one). A further group's ports are known once the group before it started."""
        if group:
            return self._group_bases[group] + MEMBER_PORT_STEP * member if self.broker_port else 0
        if member == 0 or self.slave_port is None:
            return self.broker_port + MEMBER_PORT_STEP * member if self.broker_port else 0
        return self.slave_port + MEMBER_PORT_STEP * (member - 1) if self.slave_port else 0

    def _last_port(self, group: int) -> int:
        """The highest port broker group ``group``'s members listen on (fixed ports only)."""
        return max(self.member_port(m, group) for m in range(self.slaves + 1))

    def broker_args(self, member: int, namesrv: str, tenancy_flags: list[str], *, group: int = 0) -> list[str]:
        """``orbit broker`` flags of member 0 (the master) or slave ``member`` of broker group
        ``group`` (0: broker-a)."""
        port = self.member_port(member, group)
        store_dir = os.path.join(self.root, self.member_names(group)[member])
        args = [
            "--listen", f"{self.host}:{port}",
            "--namesrv", namesrv,
            "--broker-name", group_name(group),
            "--store-dir", store_dir,
            "--flush", self.flush,
            *tenancy_flags,
            *(f for key, value in self.tier_settings.items() for f in ("--store-set", f"{key}={value}")),
            # The RocketMQ 5 clients' gRPC endpoint: two above the remoting port (the HA port is one above).
            "--set", f"grpc_listen={self.host}:{port + 2 if port else 0}",
        ]  # fmt: skip
        if self.slaves:
            role = "SLAVE" if member else self.master_role
            args += ["--role", role, "--broker-id", str(member)]
            if not port:
                args += ["--set", f"ha_listen={self.host}:0"]
            if self.tenancy and self.failover:
                args += ["--set", "failover_enabled=true"]
        return [*args, *self.broker_flags]

    def _child(self, name: str) -> Child:
        for c in self.children:
            if c.name == name:
                return c
        raise KeyError(name)

    @property
    def namesrv(self) -> str:
        return self._child("namesrv").address

    @property
    def brokers(self) -> dict[str, str]:
        return {c.name: c.address for c in self.children if c.name.startswith("broker")}

    def broker_group_addrs(self) -> list[dict[str, Any]]:
        """Every broker group with its master's and its slaves' addresses, broker-a first."""
        brokers = self.brokers
        out: list[dict[str, Any]] = []
        for group in range(self.broker_groups):
            master, *slaves = self.member_names(group)
            if master in brokers:
                addrs = [brokers[s] for s in slaves if s in brokers]
                out.append({"name": master, "master": brokers[master], "slaves": addrs})
        return out

    def endpoints(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "namesrv": self.namesrv,
            "brokers": self.brokers,
            "broker_groups": self.broker_group_addrs(),
            "grpc": self._child("broker-a").info.get("grpc_address", ""),
            "data_dir": self.root,
            "logs": self.run_dir,
        }
        if self.tenancy:
            out["control_plane"] = self.control_plane_url
            out["console"] = f"{self.control_plane_url}/console/"  # the web console (docs/console.md)
            out["operator_credentials_file"] = os.path.join(self.root, "control-plane", "operator.json")
        if self.tls:
            out["tls_ca_file"] = self.tls_files[CA_FILE]
        if self.object_store is not None:
            out["s3"] = self.object_store.endpoint_url
            out["tier_url"] = self.tier_url
        if self.demo is not None:
            out["demo"] = {
                "tenant": self.demo.tenant,
                "topic": self.demo.topic,
                "group": self.demo.group,
                "credentials_file": self.demo.credentials_file,
            }
        return out

    def dead(self) -> list[Child]:
        return [c for c in self.children if c.proc.poll() is not None]

    def stop(self) -> None:
        for c in reversed(self.children):
            c.stop()
        self.children.clear()
        if self.object_store is not None:  # last: brokers may upload while they stop
            self.object_store.stop()
        if self.tls:
            if self._env_before is None:
                os.environ.pop("ORBIT_TLS_CA", None)
            else:
                os.environ["ORBIT_TLS_CA"] = self._env_before

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
