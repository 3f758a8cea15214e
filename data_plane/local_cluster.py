"""LocalCluster: a name server and brokers as child processes on this machine, all state under
one directory. ``orbit dev up`` runs one in the foreground; benchmarks start one per run.

With ``tenancy`` the cluster is the managed service in miniature: the control plane starts first
(with an embedded PostgreSQL under ``<root>/control-plane``), the broker runs with
authentication on and reports usage with a credential of its own, the broker group is
registered, and a demo tenant is made (``data_plane/dev_tenancy.py``).

With ``slaves`` > 0 the broker group is a SYNC_MASTER (``master_role``) and that many slaves
(``broker-a-s1``, ...; listen port = broker port + 10 x n); with tenancy on too, the group fails
over automatically through the control plane's leases (docs/ha.md).

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
    _env_before: str | None = None

    @property
    def run_dir(self) -> str:
        return os.path.join(self.root, "run")

    def start(self) -> LocalCluster:
        try:
            if self.tier:
                self.start_object_store()
            tenancy_flags: list[str] = []
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
                )
                self.children.append(cp)
                self.control_plane_url = str(cp.info["url"])
                api = operator_api(self.control_plane_url, operator_file)
                broker_creds = os.path.join(self.root, "broker-a", "broker-credentials.json")
                ensure_broker_credential(api, broker_creds)
                tenancy_flags = [
                    "--set",
                    "auth_enabled=true",
                    "--set",
                    f"control_plane_url={self.control_plane_url}",
                    "--set",
                    f"broker_credentials_file={broker_creds}",
                ]
            ns_args = ["--listen", f"{self.host}:{self.namesrv_port}", *ns_tls]
            if self.tenancy:  # it checks credentials: the control plane's keys, and what its reconciler sends
                ns_args += ["--tenancy", "--control-plane-url", self.control_plane_url,
                            "--state-dir", os.path.join(self.root, "namesrv")]  # fmt: skip
            ns = spawn("namesrv", "namesrv", ns_args, self.run_dir)
            self.children.append(ns)
            members: list[Child] = []
            for i, name in enumerate(self.broker_names):  # each kept as it starts: a later failure stops it
                args = self.broker_args(i, ns.address, tenancy_flags)
                members.append(spawn("broker", name, args, self.run_dir, env=self.broker_env))
                self.children.append(members[-1])
            if api is not None:
                ensure_broker_group(api, "broker-a", [m.address for m in members], ns.address)
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
        return ["broker-a", *(f"broker-a-s{i}" for i in range(1, self.slaves + 1))]

    def member_port(self, member: int) -> int:
        """The port broker group member ``member`` (0: the master) listens on (0: a free one)."""
        if member == 0 or self.slave_port is None:
            return self.broker_port + 10 * member if self.broker_port else 0
        return self.slave_port + 10 * (member - 1) if self.slave_port else 0

    def broker_args(self, member: int, namesrv: str, tenancy_flags: list[str]) -> list[str]:
        """``orbit broker`` flags of member 0 (the master) or slave ``member``."""
        port = self.member_port(member)
        store_dir = os.path.join(self.root, self.broker_names[member])
        args = [
            "--listen", f"{self.host}:{port}",
            "--namesrv", namesrv,
            "--broker-name", "broker-a",
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

    def endpoints(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "namesrv": self.namesrv,
            "brokers": self.brokers,
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
