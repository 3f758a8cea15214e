"""The broker host modules, end to end on this machine: a root module uses the real
``name_server`` and ``broker_group`` modules (render only: no SSH) for a name server and a broker
group of a SYNC_MASTER and a SLAVE on loopback addresses 127.0.0.1-3, with every address, port
and path a module variable (so nothing rendered is rewritten). ``terraform apply`` registers the
group and its hosts with a real control plane (the module's local-exec registration); then each
rendered bootstrap script runs in dry-run mode (files written, machine-changing commands printed),
and the name server and both brokers are started from the command lines of the systemd units the
scripts wrote, with the TOML configuration and credential file they wrote — they must serve, and
both brokers must register with the name server. Once with one shared broker credential, once with
``per_host_credentials``: the module registers the group first and the control plane issues each
host its own credential, bound to its address (the name server refuses a bound credential's
registration from another host)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import socket
import stat
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio

from sdk.admin import AdminClient
from sdk.credentials import StaticToken
from tests.integration.ssh_server import SshServer, ssh_server
from tests.postgres_fixture import (  # noqa: F401
    ControlPlaneHarness,
    postgres_dsn_fixture,
    postgres_server_fixture,
    serve_control_plane,
)
from tests.terraform_support import Terraform, module_source, terraform_fixture  # noqa: F401

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

MASTER_HOST, SLAVE_HOST, NAMESRV_HOST = "127.0.0.2", "127.0.0.3", "127.0.0.1"
VENV = Path(sys.executable).parent.parent  # install_dir: its bin/orbit runs the servers
SMALL_STORE = {
    "commit_log_file_size_bytes": 16777216,
    "reserve_ahead_bytes": 0,
    "index_hash_slots": 65536,
    "index_max_entries": 262144,
    "disk_max_used_space_ratio": 0.99,
    "disk_space_clean_forcibly_ratio": 1.0,
    "disk_space_warning_level_ratio": 1.0,
}


def free_port(*hosts: str) -> int:
    """A port free on every one of ``hosts`` right now."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind((hosts[0], 0))
            port = int(s.getsockname()[1])
        try:
            for h in hosts[1:]:
                with socket.socket() as s:
                    s.bind((h, port))
        except OSError:
            continue
        return port
    raise RuntimeError("no common free port")


ROOT_MODULE = """
variable "control_plane_url" { type = string }
variable "operator_client_id" { type = string }
variable "operator_client_secret" {
  type      = string
  sensitive = true
}
variable "broker_credentials" {
  type      = object({ access_key = string, secret = string })
  default   = null
  sensitive = true
}
variable "ssh_private_key" {
  type      = string
  sensitive = true
}

locals {
  # every "host" is this machine: one SSH server, bootstraps in dry-run mode
  ssh = {
    user        = "root"
    private_key = var.ssh_private_key
    port        = {ssh_port}
    host_key    = "{ssh_host_key}"
    timeout     = "30s"
    # Terraform empties its remote-exec scripts but leaves them; keep them in the test's dir
    script_directory = "{tmp}"
  }
  env = { ORBIT_BOOTSTRAP_DRY_RUN = "1", ORBIT_BOOTSTRAP_ROOT = "{tmp}/sysroot" }
}

module "name_server" {
  source      = "{ns_source}"
  hosts       = [{ host = "{ns_host}" }]
  listen_host = null
  listen_port = {ns_port}
  control_plane_url = var.control_plane_url
  state_dir     = "{tmp}/namesrv-state"
  ssh           = local.ssh
  bootstrap_env = local.env
  staging_dir   = "{tmp}/staging"
  install_dir   = "{venv}"
  unit_dir      = "{tmp}/units"
  run_dir       = "{tmp}/run"
}

module "broker_group" {
  source = "{group_source}"
  name   = "broker-a"
  hosts = [
    { host = "127.0.0.1", advertised_host = "{master_host}", hostname = "master-host" },
    { host = "127.0.0.1", advertised_host = "{slave_host}", hostname = "slave-host" },
  ]
  listen_host            = null
  listen_port            = {broker_port}
  ha_port                = {ha_port}
  namesrv_addrs          = module.name_server.endpoints
  control_plane_url      = var.control_plane_url
  broker_credentials     = var.broker_credentials
  per_host_credentials   = {per_host}
  operator_client_id     = var.operator_client_id
  operator_client_secret = var.operator_client_secret
  capacity               = { max_queues = 500, max_msgs_per_s = 20000, storage_bytes = 1073741824 }
  data_disk              = { device = "/dev/nvme9n1", filesystem = "xfs" }
  ssh                    = local.ssh
  bootstrap_env          = local.env
  staging_dir            = "{tmp}/staging"
  store_root             = "{tmp}/stores"
  config_dir             = "{tmp}/etc"
  unit_dir               = "{tmp}/units"
  run_dir                = "{tmp}/run"
  install_dir            = "{venv}"
  store_settings         = {store_settings}
}

output "namesrv_endpoints" { value = module.name_server.endpoints }
output "namesrv_scripts" { value = module.name_server.bootstrap_scripts }
output "broker_group" { value = module.broker_group.broker_group }
output "brokers" { value = module.broker_group.brokers }
output "broker_configs" { value = module.broker_group.broker_configs }
output "systemd_units" { value = module.broker_group.systemd_units }
output "broker_scripts" { value = module.broker_group.bootstrap_scripts }
"""


def render_root(root: Path, tmp: Path, ports: dict[str, int], ssh: SshServer, *, per_host: bool) -> None:
    text = ROOT_MODULE
    values = {
        "ns_source": module_source(root, "name_server"),
        "group_source": module_source(root, "broker_group"),
        "ns_host": NAMESRV_HOST,
        "master_host": MASTER_HOST,
        "slave_host": SLAVE_HOST,
        "ns_port": str(ports["namesrv"]),
        "broker_port": str(ports["broker"]),
        "ha_port": str(ports["ha"]),
        "venv": str(VENV),
        "tmp": str(tmp),
        "store_settings": json.dumps(SMALL_STORE).replace(":", " = "),
        "ssh_port": str(ssh.port),
        "ssh_host_key": ssh.host_public_key,
        "per_host": json.dumps(per_host),
    }
    for key, value in values.items():
        text = text.replace("{" + key + "}", value)
    root.mkdir(parents=True, exist_ok=True)
    tmp.mkdir(parents=True, exist_ok=True)  # remote-exec's script_directory
    (root / "main.tf").write_text(text)


def run_script(script: str, path: Path, *, sysroot: Path, stage: Path) -> str:
    """The bootstrap script in dry-run mode; its printed commands."""
    path.write_text(script)
    done = subprocess.run(
        ["sh", str(path)],
        env={
            **os.environ,
            "ORBIT_BOOTSTRAP_DRY_RUN": "1",
            "ORBIT_BOOTSTRAP_ROOT": str(sysroot),
            "ORBIT_BOOTSTRAP_STAGE": str(stage),
        },
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def exec_start(unit: Path) -> list[str]:
    line = next(x for x in unit.read_text().splitlines() if x.startswith("ExecStart="))
    return shlex.split(line.removeprefix("ExecStart="))


@pytest_asyncio.fixture(name="control_plane")
async def reconciling_control_plane(postgres_dsn: str, tmp_path: Path) -> AsyncIterator[ControlPlaneHarness]:
    """The control plane with its reconciler: the name servers (multi-tenant) take the brokers'
    registrations once it has sent them the fleet and the access keys."""
    async with serve_control_plane(postgres_dsn, tmp_path, reconcile_interval_s=0.5) as harness:
        yield harness


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for p in reversed(started):
        if p.poll() is None:
            p.terminate()
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def serve_from_unit(
    unit: Path, ready_file: Path, log: Path, started: list[subprocess.Popen[bytes]]
) -> dict[str, object]:
    """Run the unit's ExecStart as it is; its ready file once it serves (call it in a thread: a
    starting broker fetches the token keys from the control plane this test's loop serves)."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(exec_start(unit), stdout=out, stderr=subprocess.STDOUT)
    started.append(proc)
    deadline = time.monotonic() + 60
    while not (ready_file.exists() and ready_file.stat().st_size):
        assert proc.poll() is None, f"{unit.name} exited {proc.returncode}:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"{unit.name} did not serve:\n{log.read_text()[-3000:]}"
        time.sleep(0.1)
    info: dict[str, object] = json.loads(ready_file.read_text())
    return info


@pytest.mark.parametrize("per_host", [False, True], ids=["shared_credential", "per_host_credentials"])
async def test_sync_master_and_slave_provisioned_over_ssh_start_and_register(
    terraform: Terraform,
    control_plane: ControlPlaneHarness,
    tmp_path: Path,
    servers: list[subprocess.Popen[bytes]],
    per_host: bool,
) -> None:
    async with contextlib.AsyncExitStack() as stack:
        await provision_and_start(terraform, control_plane, tmp_path, servers, stack, per_host=per_host)


async def provision_and_start(
    terraform: Terraform,
    cp: ControlPlaneHarness,
    tmp_path: Path,
    servers: list[subprocess.Popen[bytes]],
    stack: contextlib.AsyncExitStack,
    *,
    per_host: bool,
) -> None:
    made = await cp.call("POST", "/v1/admin/credentials", operator=True, json={"role": "broker"})
    assert made.status == 201, made.body
    shared_cred = {"access_key": made.body["access_key"], "secret": made.body["secret"]}
    ports = {"namesrv": free_port(NAMESRV_HOST), "broker": free_port(MASTER_HOST, SLAVE_HOST)}
    ports["ha"] = free_port(MASTER_HOST)
    root, tmp = tmp_path / "root", tmp_path / "hosts"
    ssh = await stack.enter_async_context(ssh_server())
    render_root(root, tmp, ports, ssh, per_host=per_host)
    env = {
        "TF_VAR_ssh_private_key": ssh.client_private_key,
        "TF_VAR_control_plane_url": cp.url,
        "TF_VAR_operator_client_id": cp.operator_access_key,
        "TF_VAR_operator_client_secret": cp.operator_secret,
    }
    if not per_host:
        env["TF_VAR_broker_credentials"] = json.dumps(shared_cred)

    # --- terraform: provision the "hosts" over SSH, register the group with the control plane ------
    await terraform.arun(root, "init", "-input=false")
    # one host at a time: every "host" is this machine, with one staging directory
    applied = await terraform.arun(root, "apply", "-auto-approve", "-input=false", "-parallelism=1", env=env)
    out = terraform.outputs(root)
    state_text = (root / "terraform.tfstate").read_text()
    # each host's credential file as the bootstrap left it (0600): the shared one, or the host's own
    cred_names = {k: f"broker-a-{k}.credentials.json" if per_host else "broker-a.credentials.json" for k in ("0", "1")}
    cred_files = {k: tmp / "etc" / name for k, name in cred_names.items()}
    creds = {k: json.loads(f.read_text()) for k, f in cred_files.items()}
    for f in cred_files.values():
        assert stat.S_IMODE(f.stat().st_mode) == 0o600
    if per_host:
        assert creds["0"]["access_key"] != creds["1"]["access_key"]
        assert shared_cred["access_key"] not in (creds["0"]["access_key"], creds["1"]["access_key"])
        # issued into local files only until their upload
        assert not list((root / ".terraform/orbit-credentials").iterdir())
    else:
        assert creds == {"0": shared_cred, "1": shared_cred}
    for secret in {c["secret"] for c in creds.values()} | {cp.operator_secret}:
        assert secret not in applied.stdout + applied.stderr
        assert secret not in state_text

    master_addr, slave_addr = f"{MASTER_HOST}:{ports['broker']}", f"{SLAVE_HOST}:{ports['broker']}"
    assert out["namesrv_endpoints"] == [f"{NAMESRV_HOST}:{ports['namesrv']}"]
    assert out["broker_group"]["master"] == master_addr
    assert out["broker_group"]["slaves"] == [slave_addr]
    assert out["broker_group"]["ha_address"] == f"{MASTER_HOST}:{ports['ha']}"
    assert [b["role"] for b in out["brokers"]] == ["SYNC_MASTER", "SLAVE"]
    for key, config in out["broker_configs"].items():
        assert creds[key]["secret"] not in config
        assert f'broker_credentials_file = "{cred_files[key]}"' in config

    group = await cp.call("GET", "/v1/fleet/broker-groups/broker-a", operator=True)
    assert group.status == 200, group.body
    assert group.body["broker_addrs"] == [master_addr, slave_addr]
    assert group.body["namesrv_addrs"] == out["namesrv_endpoints"]
    assert group.body["max_queues"] == 500
    hosts = {h["broker_id"]: (h["host"], h["address"]) for h in group.body["hosts"]}
    assert hosts == {0: ("master-host", master_addr), 1: ("slave-host", slave_addr)}
    bound = await cp.call("GET", "/v1/fleet/broker-groups/broker-a/hosts", operator=True)
    assert bound.status == 200, bound.body
    listed = {h["host"]: (h["status"], h["access_key"]) for h in bound.body["hosts"]}
    if per_host:
        assert listed == {
            MASTER_HOST: ("active", creds["0"]["access_key"]),
            SLAVE_HOST: ("active", creds["1"]["access_key"]),
        }
    else:
        assert listed == {MASTER_HOST: ("none", None), SLAVE_HOST: ("none", None)}

    # --- what the provisioners did over SSH: upload (SCP), then the script, then clean up ----------
    # remote-exec uploads its inline commands as a script and runs that
    inline = [d.decode() for _path, d in ssh.uploads if b"bootstrap.sh" in d]
    run_line = f"env ORBIT_BOOTSTRAP_DRY_RUN=1 ORBIT_BOOTSTRAP_ROOT={tmp}/sysroot sh {tmp}/staging/bootstrap.sh"
    assert len(inline) == 3, ssh.commands  # the name server and both brokers
    assert all(run_line in text for text in inline)
    uploaded = {path for path, _d in ssh.uploads}
    assert {f"{tmp}/staging/bootstrap.sh", *(f"{tmp}/staging/{name}" for name in cred_names.values())} <= uploaded
    assert not (tmp / "staging").exists()
    for key in ("0", "1"):
        assert (tmp / f"etc/broker-a-{key}.toml").read_text() == out["broker_configs"][key]
        assert (tmp / f"units/orbit-broker-broker-a-{key}.service").read_text() == out["systemd_units"][key]
    assert (tmp / "units/orbit-namesrv.service").exists()
    fstab = (tmp / "sysroot/etc/fstab").read_text()
    assert fstab.count(f"/dev/nvme9n1 {tmp}/stores xfs defaults,noatime,nodiratime 0 2") == 1

    # --- the bootstrap scripts run by hand, dry run: the machine changes they print ------------------
    stage, sysroot = tmp_path / "stage", tmp_path / "sysroot"
    stage.mkdir(mode=0o700)
    ns_cmds = run_script(out["namesrv_scripts"]["0"], tmp_path / "ns.sh", sysroot=sysroot / "ns", stage=stage)
    assert "+ systemctl restart orbit-namesrv.service" in ns_cmds
    assert "mkfs" not in ns_cmds
    for key in ("0", "1"):
        (stage / cred_names[key]).write_text(json.dumps(creds[key]))
        script = out["broker_scripts"][key]
        cmds = run_script(script, tmp_path / f"broker-{key}.sh", sysroot=sysroot / key, stage=stage)
        assert "+ mkfs.xfs -f -L orbit-data /dev/nvme9n1" in cmds
        assert f"+ mount {tmp}/stores" in cmds
        assert "+ echo none > /sys/block/nvme9n1/queue/scheduler" in cmds  # NVMe: no scheduler
        assert f"+ systemctl restart orbit-broker-broker-a-{key}.service" in cmds
        assert f"+ {VENV}/bin/pip install --quiet --upgrade orbit-mq" in cmds
        fstab = (sysroot / key / "etc/fstab").read_text()
        assert f"/dev/nvme9n1 {tmp}/stores xfs defaults,noatime,nodiratime 0 2" in fstab
        sysctl = (sysroot / key / "etc/sysctl.d/60-orbit.conf").read_text()
        for setting in ("vm.swappiness = 1", "vm.max_map_count = 655360", "vm.dirty_background_ratio = 50"):
            assert setting in sysctl
        assert (tmp / f"etc/broker-a-{key}.toml").read_text() == out["broker_configs"][key]
        unit = tmp / f"units/orbit-broker-broker-a-{key}.service"
        assert unit.read_text() == out["systemd_units"][key]
        # a second run changes nothing it should not (fstab keeps one line)
        run_script(script, tmp_path / f"broker-{key}.sh", sysroot=sysroot / key, stage=stage)
        assert (sysroot / key / "etc/fstab").read_text() == fstab
    assert {k: json.loads(f.read_text()) for k, f in cred_files.items()} == creds
    assert not list(stage.iterdir())

    # --- the servers, from the units' own command lines -------------------------------------------
    ns = await asyncio.to_thread(
        serve_from_unit,
        tmp / "units/orbit-namesrv.service",
        tmp / "run/namesrv.ready.json",
        tmp_path / "ns.log",
        servers,
    )
    assert ns["address"] == out["namesrv_endpoints"][0]
    master = await asyncio.to_thread(
        serve_from_unit,
        tmp / "units/orbit-broker-broker-a-0.service",
        tmp / "run/broker-a-0.ready.json",
        tmp_path / "m.log",
        servers,
    )
    assert master["address"] == master_addr
    slave = await asyncio.to_thread(
        serve_from_unit,
        tmp / "units/orbit-broker-broker-a-1.service",
        tmp / "run/broker-a-1.ready.json",
        tmp_path / "s.log",
        servers,
    )
    assert slave["address"] == slave_addr

    admin = AdminClient(out["namesrv_endpoints"], credentials=StaticToken(cp.operator_token))
    try:

        async def both_registered() -> bool:
            info = await admin.cluster_info()
            addrs = ((info.get("brokerAddrTable") or {}).get("broker-a") or {}).get("brokerAddrs") or {}
            return addrs == {"0": master_addr, "1": slave_addr}

        deadline = time.monotonic() + 30
        while not await both_registered():
            assert time.monotonic() < deadline, await admin.cluster_info()
            await asyncio.sleep(0.2)
        info = await admin.cluster_info()
        assert info["clusterAddrTable"]["DefaultCluster"] == ["broker-a"]
        assert (await admin.broker_status(master_addr))["brokerRole"] == "SYNC_MASTER"
        assert (await admin.broker_status(slave_addr))["brokerRole"] == "SLAVE"
    finally:
        await admin.close()
