"""The Orbit Terraform provider with the real ``terraform`` binary, installed the way an operator
installs it (``python -m orbit_provider.mirror`` → a filesystem mirror and its CLI configuration,
used through TF_CLI_CONFIG_FILE), against a real control plane (PostgreSQL, reconciler) and a real
broker with tenancy: init, plan, apply, plan again with no changes, a change, drift made through
the HTTP API shown by plan, import of a topic made through the API, an API error as a Terraform
diagnostic, and destroy — with the topic and the consumer group checked on the broker itself
after apply and after destroy, and the operator's secret nowhere in Terraform's output, state or
debug log. A second test does the same for retention in two tiers (unlimited and local retention)
and the quota's unlimited_retention and max_tiered_bytes."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from orbit_provider import ADDRESS, VERSION

from tests.integration.tenancy_cluster import GROUP, TenancyCluster, tenancy_fixture, until  # noqa: F401
from tests.postgres_fixture import postgres_dsn_fixture, postgres_server_fixture  # noqa: F401
from tests.terraform_support import EXAMPLES, PROVIDER_SRC, Terraform, copy_tree, terraform_fixture  # noqa: F401

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

CONFIG = """
terraform {
  required_providers {
    orbit = {
      source  = "orbit-mq/orbit"
      version = "~> 0.1"
    }
  }
}

provider "orbit" {}  # endpoint and credential from ORBIT_CONTROL_PLANE_URL / _CLIENT_ID / _CLIENT_SECRET

resource "orbit_tenant" "acme" {
  name         = "acme"
  display_name = "ACME Corp"
  plan         = "standard"
}

resource "orbit_topic" "orders" {
  tenant          = orbit_tenant.acme.name
  name            = "orders"
  retention_hours = RETENTION
  description     = "order events"
}

resource "orbit_consumer_group" "billing" {
  tenant      = orbit_tenant.acme.name
  name        = "billing"
  max_retries = MAX_RETRIES
}

resource "orbit_credential" "app" {
  tenant      = orbit_tenant.acme.name
  description = "orders app"
}

resource "orbit_credential" "filed" {
  tenant      = orbit_tenant.acme.name
  description = "secret kept out of the state"
  secret_file = "SECRET_FILE"
}

resource "orbit_acl" "app" {
  tenant     = orbit_tenant.acme.name
  access_key = orbit_credential.app.access_key
  grant {
    resource = "topic"
    pattern  = "orders"
    actions  = ["publish", "subscribe"]
  }
  grant {
    resource = "group"
    pattern  = "billing"
    actions  = ["subscribe"]
  }
}

resource "orbit_quota" "acme" {
  tenant     = orbit_tenant.acme.name
  max_topics = 20
}

resource "orbit_broker_host_credential" "broker" {
  broker_group = "broker-a"
  host         = "127.0.0.1"
}

data "orbit_endpoints" "this" {}

data "orbit_topic" "orders" {
  tenant = orbit_tenant.acme.name
  name   = orbit_topic.orders.name
}

output "namesrv_addr" { value = data.orbit_endpoints.this.namesrv_addr }
output "token_url" { value = data.orbit_endpoints.this.token_url }
output "orders_wire_name" { value = data.orbit_topic.orders.wire_name }
output "orders_queues" { value = data.orbit_topic.orders.queue_count }
output "app_access_key" { value = orbit_credential.app.access_key }
output "app_secret" {
  value     = orbit_credential.app.secret
  sensitive = true
}
output "broker_access_key" { value = orbit_broker_host_credential.broker.access_key }
output "broker_secret" {
  value     = orbit_broker_host_credential.broker.secret
  sensitive = true
}
"""

IMPORTED = """
resource "orbit_topic" "payments" {
  tenant          = "acme"
  name            = "payments"
  retention_hours = 12
  description     = "made through the API"
}
"""

BAD = """
resource "orbit_topic" "too_long" {
  tenant          = orbit_tenant.acme.name
  name            = "too-long"
  retention_hours = 1000
}
"""


def write_config(root: Path, *, retention: int, max_retries: int, extra: str = "") -> None:
    text = CONFIG.replace("RETENTION", str(retention)).replace("MAX_RETRIES", str(max_retries))
    text = text.replace("SECRET_FILE", str(root / "secrets" / "filed.json"))
    (root / "main.tf").write_text(text + extra)


def install_mirror(mirror: Path) -> Path:
    """The operator's install command; the CLI configuration it wrote."""
    done = subprocess.run(
        [sys.executable, "-m", "orbit_provider.mirror", "--dir", str(mirror)],
        env={**os.environ, "PYTHONPATH": str(PROVIDER_SRC)},
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    config = mirror / "orbit.tfrc"
    assert f"export TF_CLI_CONFIG_FILE={config}" in done.stdout
    launcher = (
        mirror
        / "registry.terraform.io/orbit-mq/orbit"
        / VERSION
        / "linux_amd64"
        / f"terraform-provider-orbit_v{VERSION}"
    )
    assert launcher.stat().st_mode & stat.S_IXUSR
    return config


def as_operator(terraform: Terraform, tenancy: TenancyCluster, tmp_path: Path) -> Terraform:
    """Terraform with the provider installed from a mirror under tmp_path, acting as the operator."""
    cp = tenancy.cp
    return dataclasses.replace(
        terraform,
        cli_config=str(install_mirror(tmp_path / "mirror")),
        extra_env={
            "ORBIT_CONTROL_PLANE_URL": cp.url,
            "ORBIT_CLIENT_ID": cp.operator_access_key,
            "ORBIT_CLIENT_SECRET": cp.operator_secret,
            "ORBIT_PROVIDER_TEST_MARKER": "1",
        },
    )


async def test_provider_manages_tenant_resources_on_real_brokers(
    terraform: Terraform, tenancy: TenancyCluster, tmp_path: Path
) -> None:
    cp = tenancy.cp
    tf = as_operator(terraform, tenancy, tmp_path)
    root = tmp_path / "root"
    root.mkdir()
    seen: list[str] = []  # everything Terraform printed, checked for secrets at the end

    async def run(*args: str, ok: tuple[int, ...] = (0,)) -> subprocess.CompletedProcess[str]:
        done = await tf.arun(root, *args, ok=ok)
        seen.extend([done.stdout, done.stderr])
        return done

    # --- init from the filesystem mirror (no registry), plan, apply, plan again ----------------------
    write_config(root, retention=24, max_retries=5)
    init = await run("init", "-input=false")
    assert f"Installing orbit-mq/orbit v{VERSION}" in init.stdout, init.stdout
    assert ADDRESS in (root / ".terraform.lock.hcl").read_text()
    assert (await run("plan", "-detailed-exitcode", "-input=false", ok=(2,))).returncode == 2
    await run("apply", "-auto-approve", "-input=false")
    again = await run("plan", "-detailed-exitcode", "-input=false")
    assert "No changes." in again.stdout

    out = tf.outputs(root)
    assert out["namesrv_addr"] == tenancy.namesrv.address  # the new GET /v1/endpoints
    assert out["token_url"] == cp.url + "/oauth/token"
    assert out["orders_wire_name"] == "acme%orders"
    assert out["orders_queues"] == 4

    # the resources on the broker itself
    async def on_broker() -> bool:
        return "acme%orders" in await tenancy.broker_topics() and "acme%billing" in await tenancy.broker_groups()

    await until(on_broker, "acme%orders and acme%billing on the broker")
    topic = (await tenancy.broker_topics())["acme%orders"]
    assert topic["writeQueueNums"] == 4
    assert (await tenancy.broker_groups())["acme%billing"]["retryMaxTimes"] == 5

    # the credential works, has exactly the ACL's grants, and the filed one's secret is only in its file
    token = await cp.token_for(out["app_access_key"], out["app_secret"])
    acls = await cp.call("GET", "/v1/tenants/acme/acls", operator=True)
    grants = next(a["grants"] for a in acls.body["acls"] if a["access_key"] == out["app_access_key"])
    assert sorted(grants, key=lambda g: g["resource"]) == [
        {"resource": "group", "pattern": "billing", "actions": ["subscribe"]},
        {"resource": "topic", "pattern": "orders", "actions": ["publish", "subscribe"]},
    ]
    got = await cp.call("GET", "/v1/tenants/acme/topics/orders", token=token)
    assert got.status == 200, got.body
    endpoints = await cp.call("GET", "/v1/endpoints", token=token)  # any credential, a tenant's too
    assert endpoints.body == {"namesrv_addrs": [tenancy.namesrv.address]}
    assert (await cp.call("GET", "/v1/endpoints")).status == 401
    filed = json.loads((root / "secrets/filed.json").read_text())
    assert stat.S_IMODE((root / "secrets/filed.json").stat().st_mode) == 0o600
    await cp.token_for(filed["access_key"], filed["secret"])
    state = (root / "terraform.tfstate").read_text()
    assert filed["secret"] not in state
    assert cp.operator_secret not in state
    quota = await cp.call("GET", "/v1/tenants/acme/quota", operator=True)
    assert quota.body["overrides"] == {"max_topics": 20}
    # the broker host's own credential: bound to the host, and it logs in
    broker_hosts = (await cp.call("GET", "/v1/fleet/broker-groups/broker-a/hosts", operator=True)).body["hosts"]
    assert [(h["host"], h["access_key"], h["status"]) for h in broker_hosts] == [
        ("127.0.0.1", out["broker_access_key"], "active")
    ]
    await cp.token_for(out["broker_access_key"], out["broker_secret"])

    # --- a change ----------------------------------------------------------------------------------
    write_config(root, retention=48, max_retries=7)
    changed = await run("apply", "-auto-approve", "-input=false")
    assert "2 changed, 0 destroyed" in changed.stdout, changed.stdout
    assert (await cp.call("GET", "/v1/tenants/acme/topics/orders", operator=True)).body["retention_hours"] == 48

    async def retries_on_broker() -> bool:
        return bool((await tenancy.broker_groups())["acme%billing"]["retryMaxTimes"] == 7)

    await until(retries_on_broker, "max_retries 7 on the broker")

    # --- drift made through the HTTP API shows in plan; apply puts it back --------------------------
    patched = await cp.call("PATCH", "/v1/tenants/acme/topics/orders", operator=True, json={"retention_hours": 100})
    assert patched.status == 200, patched.body
    drift = await run("plan", "-detailed-exitcode", "-input=false", ok=(2,))
    assert re.search(r"retention_hours\s+= 100 -> 48", drift.stdout), drift.stdout
    await run("apply", "-auto-approve", "-input=false")
    assert (await cp.call("GET", "/v1/tenants/acme/topics/orders", operator=True)).body["retention_hours"] == 48
    # a group deleted behind Terraform's back is planned to be made again
    assert (await cp.call("DELETE", "/v1/tenants/acme/groups/billing", operator=True)).status == 204
    recreate = await run("plan", "-detailed-exitcode", "-input=false", ok=(2,))
    assert "orbit_consumer_group.billing will be created" in recreate.stdout, recreate.stdout
    await run("apply", "-auto-approve", "-input=false")

    # --- import of a topic made through the API ------------------------------------------------------
    made = await cp.call(
        "POST",
        "/v1/tenants/acme/topics",
        operator=True,
        json={"name": "payments", "retention_hours": 12, "description": "made through the API"},
    )
    assert made.status == 201, made.body
    write_config(root, retention=48, max_retries=7, extra=IMPORTED)
    await run("import", "-input=false", "orbit_topic.payments", "acme/payments")
    assert "No changes." in (await run("plan", "-detailed-exitcode", "-input=false")).stdout

    # --- the API's refusal as a Terraform diagnostic --------------------------------------------------
    write_config(root, retention=48, max_retries=7, extra=IMPORTED + BAD)
    refused = await run("apply", "-auto-approve", "-input=false", ok=(1,))
    assert "Orbit API error: quota_exceeded" in refused.stderr, refused.stderr
    flat = " ".join(refused.stderr.split())  # Terraform wraps a diagnostic's lines
    assert "answered 422 quota_exceeded: plan limit max_retention_hours is 168; this request needs 1000" in flat
    assert (await cp.call("GET", "/v1/tenants/acme/topics/too-long", operator=True)).status == 404
    write_config(root, retention=48, max_retries=7, extra=IMPORTED)

    # --- the provider logs no secret (Terraform's debug log holds the provider's output) ------------
    log = tmp_path / "terraform.log"
    traced = await tf.arun(root, "plan", "-input=false", env={"TF_LOG": "TRACE", "TF_LOG_PATH": str(log)}, ok=(0, 2))
    seen.extend([traced.stdout, traced.stderr, log.read_text(errors="replace")])
    assert "orbit_provider" in seen[-1] or "terraform-provider-orbit" in seen[-1]  # the log did cover it

    # --- destroy: gone from the control plane and from the broker -----------------------------------
    await run("destroy", "-auto-approve", "-input=false")
    assert (await cp.call("GET", "/v1/tenants/acme", operator=True)).status == 404
    assert not (root / "secrets/filed.json").exists()
    broker_hosts = (await cp.call("GET", "/v1/fleet/broker-groups/broker-a/hosts", operator=True)).body["hosts"]
    assert [(h["access_key"], h["status"]) for h in broker_hosts] == [(out["broker_access_key"], "revoked")]

    async def gone_from_broker() -> bool:
        topics, groups = await tenancy.broker_topics(), await tenancy.broker_groups()
        return not {"acme%orders", "acme%payments"} & set(topics) and "acme%billing" not in groups

    await until(gone_from_broker, "acme's topics and group gone from the broker")

    for text in seen:
        assert cp.operator_secret not in text
        assert filed["secret"] not in text
        assert out["app_secret"] not in text  # a sensitive attribute and output: never printed
        assert out["broker_secret"] not in text


TIERS = """
terraform {
  required_providers {
    orbit = {
      source  = "orbit-mq/orbit"
      version = "~> 0.1"
    }
  }
}

provider "orbit" {}

resource "orbit_tenant" "acme" { # standard: its plan keeps messages at most 168 hours
  name = "acme"
  plan = "standard"
}

resource "orbit_tenant" "bigco" { # enterprise: its plan allows unlimited retention
  name = "bigco"
  plan = "enterprise"
}

resource "orbit_quota" "acme" {
  tenant           = orbit_tenant.acme.name
  max_tiered_bytes = 5368709120
  ACME_QUOTA
}

resource "orbit_topic" "archive" {
  tenant = orbit_tenant.bigco.name
  name   = "archive"
  ARCHIVE
}

resource "orbit_topic" "orders" {
  tenant          = orbit_tenant.acme.name
  name            = "orders"
  retention_hours = 48
  ORDERS
}

data "orbit_topic" "archive" {
  tenant = orbit_tenant.bigco.name
  name   = orbit_topic.archive.name
}

output "archive_unlimited" { value = data.orbit_topic.archive.unlimited_retention }
output "acme_effective" { value = orbit_quota.acme.effective }
output "acme_unlimited" { value = orbit_quota.acme.effective_unlimited_retention }
"""

FOREVER = """
resource "orbit_topic" "forever" {
  tenant              = orbit_tenant.acme.name
  name                = "forever"
  unlimited_retention = true
  depends_on          = [orbit_quota.acme]
}
"""

CONFLICTING = """
resource "orbit_topic" "both" {
  tenant              = orbit_tenant.bigco.name
  name                = "both"
  retention_hours     = 48
  unlimited_retention = true
}

resource "orbit_topic" "local_past_total" {
  tenant                = orbit_tenant.bigco.name
  name                  = "local-past-total"
  retention_hours       = 12
  local_retention_hours = 24
}
"""

IMPORTED_TIERS = """
resource "orbit_topic" "ledger" {
  tenant                = "bigco"
  name                  = "ledger"
  unlimited_retention   = true
  local_retention_hours = 12
}

resource "orbit_quota" "bigco" {
  tenant              = "bigco"
  unlimited_retention = false
  max_tiered_bytes    = 1073741824
}
"""
GIB = 1 << 30
FOR_GOOD = "unlimited_retention = true\n  local_retention_hours = 24"  # the archive, mostly
ALLOW_UNLIMITED = "unlimited_retention = true"  # acme's quota override, once its topic needs it


def write_tiers(
    root: Path, *, archive: str = FOR_GOOD, orders: str = "", acme_quota: str = "", extra: str = ""
) -> None:
    """TIERS with the archive's retention, the orders' local retention and acme's quota flag."""
    text = TIERS.replace("ARCHIVE", archive).replace("ORDERS", orders).replace("ACME_QUOTA", acme_quota)
    (root / "main.tf").write_text(text + extra)


async def test_provider_manages_retention_in_two_tiers_and_the_storage_quotas(
    terraform: Terraform, tenancy: TenancyCluster, tmp_path: Path
) -> None:
    """Unlimited retention (on a plan that allows it, refused on one that does not until a quota
    override allows it), local retention set, changed and removed, plan-time checks, drift,
    import, and the quota's unlimited_retention and max_tiered_bytes — every change checked in
    the control plane, and the retentions in the snapshot the broker keeps."""
    cp = tenancy.cp
    tf = as_operator(terraform, tenancy, tmp_path)
    root = tmp_path / "root"
    root.mkdir()
    snapshot = tenancy.tmp / "stores" / GROUP / "config" / "tenants.json"

    async def run(*args: str, ok: tuple[int, ...] = (0,)) -> subprocess.CompletedProcess[str]:
        return await tf.arun(root, *args, ok=ok)

    async def no_changes() -> None:
        again = await run("plan", "-detailed-exitcode", "-input=false")
        assert "No changes." in again.stdout, again.stdout

    async def topic(tenant: str, name: str) -> tuple[object, object]:
        got = await cp.call("GET", f"/v1/tenants/{tenant}/topics/{name}", operator=True)
        assert got.status == 200, got.body
        return got.body["retention_hours"], got.body["local_retention_hours"]

    async def on_broker(retention: dict[str, object], local: dict[str, object]) -> None:
        """The retentions in the tenancy snapshot the broker keeps (the topics of this test)."""

        def kept() -> bool:
            state = json.loads(snapshot.read_text()) if snapshot.exists() else {}
            return state.get("topic_retention_hours") == retention and state.get("topic_local_retention_hours") == local

        await until(kept, f"retentions {retention} and local {local} in {snapshot}")

    async def apply(**config: str) -> str:
        """Write the configuration, apply it and plan again: no changes. What apply printed."""
        write_tiers(root, **config)
        done = await run("apply", "-auto-approve", "-input=false")
        await no_changes()
        return done.stdout

    # --- unlimited retention on a plan that allows it; local retention set --------------------------
    write_tiers(root)  # init needs the configuration's required_providers
    await run("init", "-input=false")
    await apply(orders="local_retention_hours = 12")
    assert await topic("bigco", "archive") == ("unlimited", 24)
    assert await topic("acme", "orders") == (48, 12)
    await on_broker({"bigco%archive": None, "acme%orders": 48}, {"bigco%archive": 24, "acme%orders": 12})
    quota = await cp.call("GET", "/v1/tenants/acme/quota", operator=True)
    assert quota.body["overrides"] == {"max_tiered_bytes": 5 * GIB}
    out = tf.outputs(root)
    assert out["archive_unlimited"] is True  # the data source too
    assert out["acme_effective"]["max_tiered_bytes"] == 5 * GIB
    assert out["acme_unlimited"] is False

    # --- checked at plan time, before any request ---------------------------------------------------
    write_tiers(root, orders="local_retention_hours = 12", extra=CONFLICTING)
    refused = await run("plan", "-input=false", ok=(1,))
    flat = " ".join(refused.stderr.split())  # Terraform wraps a diagnostic's lines
    assert "Error: Conflicting retention" in flat, refused.stderr
    assert "unlimited_retention = true keeps the messages for good and retention_hours keeps them" in flat
    assert "Error: Invalid local_retention_hours" in flat
    assert "local_retention_hours (24) must be at most retention_hours (12)" in flat

    # --- unlimited retention on a plan that does not allow it: the API's refusal --------------------
    write_tiers(root, orders="local_retention_hours = 12", extra=FOREVER)
    refused = await run("apply", "-auto-approve", "-input=false", ok=(1,))
    flat = " ".join(refused.stderr.split())
    assert "Orbit API error: quota_exceeded" in flat, refused.stderr
    assert 'answered 422 quota_exceeded: retention_hours "unlimited" needs a plan with unlimited_retention' in flat
    assert (await cp.call("GET", "/v1/tenants/acme/topics/forever", operator=True)).status == 404

    # --- ... allowed by the tenant's quota override ------------------------------------------------
    allowed = await apply(orders="local_retention_hours = 12", acme_quota=ALLOW_UNLIMITED, extra=FOREVER)
    assert "1 added, 1 changed, 0 destroyed" in allowed, allowed
    assert await topic("acme", "forever") == ("unlimited", None)
    quota = await cp.call("GET", "/v1/tenants/acme/quota", operator=True)
    assert quota.body["overrides"] == {"max_tiered_bytes": 5 * GIB, "unlimited_retention": True}
    assert tf.outputs(root)["acme_unlimited"] is True

    # --- local retention changed; unlimited retention ended by hours ----------------------------------
    changed = await apply(
        archive="retention_hours = 500\n  local_retention_hours = 24",
        orders="local_retention_hours = 6",
        acme_quota=ALLOW_UNLIMITED,
        extra=FOREVER,
    )
    assert "0 added, 2 changed, 0 destroyed" in changed, changed
    assert await topic("bigco", "archive") == (500, 24)
    assert await topic("acme", "orders") == (48, 6)

    # --- local retention removed (the broker's default); unlimited again ------------------------------
    changed = await apply(acme_quota=ALLOW_UNLIMITED, extra=FOREVER)
    assert "0 added, 2 changed, 0 destroyed" in changed, changed
    assert await topic("bigco", "archive") == ("unlimited", 24)
    assert await topic("acme", "orders") == (48, None)
    await on_broker({"bigco%archive": None, "acme%orders": 48, "acme%forever": None}, {"bigco%archive": 24})

    # --- drift through the API: hours on a topic kept for good, planned back -----------------------
    patched = await cp.call("PATCH", "/v1/tenants/bigco/topics/archive", operator=True, json={"retention_hours": 100})
    assert patched.status == 200, patched.body
    drift = await run("plan", "-detailed-exitcode", "-input=false", ok=(2,))
    assert re.search(r"retention_hours\s+= 100 -> null", drift.stdout), drift.stdout
    assert re.search(r"unlimited_retention\s+= false -> true", drift.stdout), drift.stdout
    await apply(acme_quota=ALLOW_UNLIMITED, extra=FOREVER)
    assert await topic("bigco", "archive") == ("unlimited", 24)

    # --- import: a topic kept for good and a quota made through the API -------------------------------
    made = await cp.call(
        "POST",
        "/v1/tenants/bigco/topics",
        operator=True,
        json={"name": "ledger", "retention_hours": "unlimited", "local_retention_hours": 12},
    )
    assert made.status == 201, made.body
    put = await cp.call(
        "PUT", "/v1/tenants/bigco/quota", operator=True, json={"unlimited_retention": False, "max_tiered_bytes": GIB}
    )
    assert put.status == 200, put.body
    write_tiers(root, acme_quota=ALLOW_UNLIMITED, extra=FOREVER + IMPORTED_TIERS)
    await run("import", "-input=false", "orbit_topic.ledger", "bigco/ledger")
    await run("import", "-input=false", "orbit_quota.bigco", "bigco")
    await no_changes()
    state = json.loads((root / "terraform.tfstate").read_text())
    attributes = {(r["type"], r["name"]): r["instances"][0]["attributes"] for r in state["resources"]}
    ledger, bigco = attributes[("orbit_topic", "ledger")], attributes[("orbit_quota", "bigco")]
    assert [ledger[k] for k in ("retention_hours", "unlimited_retention", "local_retention_hours")] == [None, True, 12]
    assert [bigco[k] for k in ("unlimited_retention", "max_tiered_bytes", "effective_unlimited_retention")] == [
        False,
        GIB,
        False,
    ]

    # --- destroy ----------------------------------------------------------------------------------
    await run("destroy", "-auto-approve", "-input=false")
    for tenant in ("acme", "bigco"):
        assert (await cp.call("GET", f"/v1/tenants/{tenant}", operator=True)).status == 404


async def test_tenant_resources_example_validates_with_the_installed_provider(
    terraform: Terraform, tmp_path: Path
) -> None:
    """The documented example against the provider's schema (no control plane needed)."""
    tf = dataclasses.replace(terraform, cli_config=str(install_mirror(tmp_path / "mirror")))
    example = copy_tree(EXAMPLES / "tenant_resources", tmp_path / "example")
    await tf.arun(example, "init", "-backend=false", "-input=false")
    assert "The configuration is valid" in (await tf.arun(example, "validate")).stdout
