"""The Orbit provider's parts without Terraform or a control plane: every resource answers whole
objects of its schema, plans mark what only the apply knows, errors carry the API's words, the
configuration falls back to the environment, and the mirror installer writes Terraform's layout
and a CLI configuration."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path
from typing import Any

import pytest
from orbit_provider import VERSION, mirror
from orbit_provider.client import ApiError, _decode_claims
from orbit_provider.data_sources import DATA_SOURCES
from orbit_provider.provider import ConfigurationError, OrbitProvider
from orbit_provider.resources import (
    RESOURCES,
    Acl,
    BrokerHostCredential,
    ConsumerGroup,
    Credential,
    Quota,
    Tenant,
    Topic,
)
from tf.iface import PlanContext
from tf.types import Unknown
from tf.utils import Diagnostics

pytestmark = pytest.mark.unit

TOPIC = {
    "tenant_id": "acme",
    "name": "orders",
    "message_type": "NORMAL",
    "retention_hours": 24,
    "local_retention_hours": 12,
    "throughput_hint_msgs_per_s": None,
    "queue_count": 4,
    "description": "",
    "status": "active",
    "created_at": "2026-01-01T00:00:00+00:00",
    "updated_at": "2026-01-01T00:00:00+00:00",
    "wire_name": "acme%orders",
    "placements": [{"broker_group": "broker-a", "queue_count": 4, "applied": True}],
}
GROUP = {
    "tenant_id": "acme",
    "name": "billing",
    "retry_policy": "exponential",
    "fixed_interval_ms": 10000,
    "max_retries": 16,
    "consume_orderly": False,
    "description": "",
    "created_at": "2026-01-01T00:00:00+00:00",
    "wire_name": "acme%billing",
    "retry_topic": "%RETRY%acme%billing",
    "dlq_topic": "%DLQ%acme%billing",
}
CREDENTIAL: dict[str, Any] = {
    "access_key": "AKABCDEFGHIJKLMNOPQRST",
    "tenant_id": "acme",
    "role": "tenant",
    "grants": [],
    "description": "app",
    "status": "active",
    "created_at": "2026-01-01T00:00:00+00:00",
    "revoked_at": None,
}
QUOTA = {
    "tenant_id": "acme",
    "plan": "standard",
    "overrides": {"max_topics": 20, "unlimited_retention": True},
    "effective": {"max_topics": 20, "max_tiered_bytes": None, "unlimited_retention": True},
}
TENANT = {"id": "acme", "display_name": "ACME", "plan": "standard", "status": "active", "created_at": "x"}
BROKER_HOST = {
    "host": "10.0.0.1",
    "broker_addrs": ["10.0.0.1:10911"],
    "access_key": "AKABCDEFGHIJKLMNOPQRST",
    "status": "active",
    "created_at": "2026-01-01T00:00:00+00:00",
    "revoked_at": None,
}

STATES: dict[type[Any], dict[str, Any]] = {
    Tenant: Tenant._state(TENANT),
    Topic: Topic._state(TOPIC),
    ConsumerGroup: ConsumerGroup._state(GROUP),
    Credential: Credential._state(CREDENTIAL, secret=None, secret_file=None),
    Acl: Acl._state("acme", "AKX", [{"resource": "topic", "pattern": "*", "actions": ["subscribe", "publish"]}]),
    Quota: Quota._state(QUOTA),
    BrokerHostCredential: BrokerHostCredential._state("broker-a", BROKER_HOST, secret=None),
}


def test_every_resource_is_covered() -> None:
    assert set(STATES) == set(RESOURCES)
    assert sorted("orbit_" + r.get_name() for r in RESOURCES) == [
        "orbit_acl",
        "orbit_broker_host_credential",
        "orbit_consumer_group",
        "orbit_credential",
        "orbit_quota",
        "orbit_tenant",
        "orbit_topic",
    ]
    assert sorted("orbit_" + d.get_name() for d in DATA_SOURCES) == ["orbit_endpoints", "orbit_topic"]


@pytest.mark.parametrize("resource", RESOURCES, ids=lambda r: r.get_name())
def test_states_are_whole_objects_of_the_schema(resource: Any) -> None:
    schema = resource.get_schema()
    names = {a.name for a in schema.attributes} | {b.type_name for b in schema.block_types}
    assert set(STATES[resource]) == names
    attrs = {a.name: a for a in schema.attributes}
    assert attrs["id"].computed
    assert not attrs["id"].optional
    assert all(a.description for a in schema.attributes)


def test_secrets_are_sensitive() -> None:
    for resource in (Credential, BrokerHostCredential):
        credential = {a.name: a for a in resource.get_schema().attributes}
        assert credential["secret"].sensitive
        assert credential["secret"].computed
    provider = {a.name: a for a in OrbitProvider().get_provider_schema(Diagnostics()).attributes}
    assert provider["client_secret"].sensitive


def test_acl_state_sorts_actions() -> None:
    assert STATES[Acl]["grant"] == [{"resource": "topic", "pattern": "*", "actions": ["publish", "subscribe"]}]


def plan(resource: Any, changed: set[str], current: dict[str, Any], planned: dict[str, Any]) -> dict[str, Any]:
    inst = resource(OrbitProvider())
    out: dict[str, Any] = inst.plan(PlanContext(Diagnostics(), "t", changed_fields=changed), current, dict(planned))
    return out


def test_a_larger_throughput_hint_leaves_queues_to_the_apply() -> None:
    state = STATES[Topic]
    planned = plan(Topic, {"throughput_hint_msgs_per_s"}, state, {**state, "throughput_hint_msgs_per_s": 9000})
    assert planned["queue_count"] is Unknown
    assert planned["placements"] is Unknown
    assert planned["status"] is Unknown
    retention_only = plan(Topic, {"retention_hours"}, state, {**state, "retention_hours": 48})
    assert retention_only["queue_count"] == 4
    assert retention_only["status"] == "active"


def test_a_topic_kept_for_good_reads_back_as_unlimited_retention_without_hours() -> None:
    forever = Topic._state({**TOPIC, "retention_hours": "unlimited", "local_retention_hours": None})
    retention = ("retention_hours", "unlimited_retention", "local_retention_hours")
    assert [forever[k] for k in retention] == [None, True, None]
    assert [STATES[Topic][k] for k in retention] == [24, False, 12]


def validate_topic(**config: Any) -> list[tuple[str, str, Any]]:
    """(summary, detail, path) of each diagnostic of a topic's configuration."""
    diags = Diagnostics()
    whole = {a.name: None for a in Topic.get_schema().attributes} | {"name": "orders", **config}
    Topic(OrbitProvider()).validate(diags, "orbit_topic", whole)
    return [(d.summary, d.detail, d.path) for d in diags.diagnostics]


def test_topic_retention_is_checked_at_plan_time() -> None:
    assert validate_topic(unlimited_retention=True, local_retention_hours=24) == []
    assert validate_topic(retention_hours=48, unlimited_retention=False, local_retention_hours=48) == []
    assert validate_topic(retention_hours=Unknown, local_retention_hours=Unknown) == []
    [conflict] = validate_topic(retention_hours=48, unlimited_retention=True)
    assert conflict[0] == "Conflicting retention"
    assert conflict[1].endswith("set one of them")
    [maybe] = validate_topic(retention_hours=48, unlimited_retention=Unknown)
    assert maybe[0] == "Conflicting retention"
    assert "known only after apply" in maybe[1]
    [too_long] = validate_topic(retention_hours=48, local_retention_hours=72)
    assert too_long[0] == "Invalid local_retention_hours"
    assert "local_retention_hours (72) must be at most retention_hours (48)" in too_long[1]
    for bad in (0, 8761, 1.5, True):
        assert [d[:2] for d in validate_topic(local_retention_hours=bad)] == [
            (
                "Invalid local_retention_hours",
                f"local_retention_hours = {bad}: must be a whole number of hours within 1..8760",
            )
        ]
    assert [d[0] for d in validate_topic(retention_hours=9000)] == ["Invalid retention_hours"]


def plan_topic(changed: set[str], current: dict[str, Any], **planned: Any) -> tuple[dict[str, Any], list[str]]:
    """A topic's update plan, and its diagnostics as "summary: detail"."""
    diags = Diagnostics()
    out = Topic(OrbitProvider()).plan(PlanContext(diags, "t", changed_fields=changed), current, {**current, **planned})
    assert out is not None
    return out, [f"{d.summary}: {d.detail}" for d in diags.diagnostics]


def test_a_topic_plan_derives_one_way_of_saying_retention_from_the_other() -> None:
    finite = STATES[Topic]  # 24 hours, 12 of them local
    forever = Topic._state({**TOPIC, "retention_hours": "unlimited"})
    # unlimited_retention set (retention_hours left out, so carried over): no hours
    planned, errors = plan_topic({"unlimited_retention"}, finite, unlimited_retention=True)
    assert (planned["retention_hours"], planned["unlimited_retention"], errors) == (None, True, [])
    # retention_hours set on a topic kept for good (unlimited_retention carried over): no longer unlimited
    planned, errors = plan_topic({"retention_hours"}, forever, retention_hours=48)
    assert (planned["retention_hours"], planned["unlimited_retention"], errors) == (48, False, [])
    planned, _errors = plan_topic({"retention_hours"}, forever, retention_hours=Unknown)
    assert planned["unlimited_retention"] is False
    # unlimited_retention from a resource not made yet: so are the hours
    assert plan_topic({"unlimited_retention"}, finite, unlimited_retention=Unknown)[0]["retention_hours"] is Unknown
    # nothing changed: nothing derived
    assert plan_topic(set(), forever)[0] == forever
    # unlimited_retention = false, and no hours to keep the messages for instead
    _planned, errors = plan_topic({"unlimited_retention"}, forever, unlimited_retention=False)
    assert errors == [
        "Ending unlimited retention needs retention_hours: topic orders keeps its messages for good; with "
        "unlimited_retention = false set retention_hours to the hours to keep them"
    ]
    # the total lowered under the local retention the configuration keeps
    _planned, errors = plan_topic({"retention_hours"}, finite, retention_hours=6)
    assert errors == [
        "Invalid local_retention_hours: local_retention_hours (12) must be at most retention_hours (6): the "
        "brokers' copy is part of the total (lower it too, or leave it out for the broker's default)"
    ]


def test_topic_changes_go_to_the_api_as_it_takes_them() -> None:
    calls: list[tuple[str, str, Any]] = []

    class Api:
        def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
            calls.append((method, path, body))
            retention = body.get("retention_hours", TOPIC["retention_hours"])
            return 200, {**TOPIC, **body, "retention_hours": retention}

    topic = Topic(OrbitProvider())
    topic.provider.configure_provider(Diagnostics(), {"wait_for_active_s": 0})
    topic.provider._client = Api()  # type: ignore[assignment]  # a stand-in of OrbitClient
    finite = STATES[Topic]
    topic._update(Diagnostics(), finite, {**finite, "unlimited_retention": True, "retention_hours": None})
    topic._update(Diagnostics(), finite, {**finite, "local_retention_hours": None})
    forever = Topic._state({**TOPIC, "retention_hours": "unlimited"})
    topic._update(Diagnostics(), forever, {**forever, "unlimited_retention": False, "retention_hours": 48.0})
    path = "/v1/tenants/acme/topics/orders"
    assert calls == [
        ("PATCH", path, {"retention_hours": "unlimited"}),
        ("PATCH", path, {"local_retention_hours": None}),
        ("PATCH", path, {"retention_hours": 48}),
    ]
    assert type(calls[-1][2]["retention_hours"]) is int


def test_suspending_a_tenant_plans_its_status() -> None:
    state = STATES[Tenant]
    assert plan(Tenant, {"suspended"}, state, {**state, "suspended": True})["status"] == "suspended"


def test_quota_effective_limits_follow_a_change() -> None:
    state = STATES[Quota]
    assert plan(Quota, {"max_topics"}, state, {**state, "max_topics": 30})["effective"] is Unknown
    flag = plan(Quota, {"unlimited_retention"}, state, {**state, "unlimited_retention": None})
    assert flag["effective_unlimited_retention"] is Unknown


def test_quota_reads_back_the_flag_and_the_tiered_cap() -> None:
    state = STATES[Quota]
    assert (state["unlimited_retention"], state["max_tiered_bytes"]) == (True, None)
    assert state["effective"] == {"max_topics": 20}  # no cap on tiered bytes: not in the map of numbers
    assert state["effective_unlimited_retention"] is True
    capped = Quota._state(
        {**QUOTA, "overrides": {"max_tiered_bytes": 1 << 30}, "effective": {"max_tiered_bytes": 1 << 30}}
    )
    assert (capped["unlimited_retention"], capped["max_tiered_bytes"]) == (None, 1 << 30)
    assert capped["effective"] == {"max_tiered_bytes": 1 << 30}


def test_api_error_carries_the_api_message() -> None:
    e = ApiError("POST", "/v1/tenants/acme/topics", 422, "quota_exceeded", "plan limit max_topics is 5", {"limit": "x"})
    assert e.summary == "Orbit API error: quota_exceeded"
    assert "POST /v1/tenants/acme/topics answered 422 quota_exceeded: plan limit max_topics is 5" in e.detail
    assert '"limit": "x"' in e.detail
    down = ApiError("GET", "/v1/endpoints", 0, "unreachable", "http://127.0.0.1:1: refused")
    assert down.summary == "Orbit control plane unreachable"


def test_token_claims_are_read_without_verification() -> None:
    token = "e30.eyJ0ZW5hbnQiOiJhY21lIiwicm9sZSI6InRlbmFudCJ9.sig"  # {"tenant":"acme","role":"tenant"}
    assert _decode_claims(token) == {"tenant": "acme", "role": "tenant"}
    assert _decode_claims("not a token") == {}


def test_configuration_falls_back_to_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    provider = OrbitProvider()
    provider.configure_provider(Diagnostics(), {"endpoint": None, "client_id": None, "client_secret": None})
    with pytest.raises(ConfigurationError, match="endpoint \\(or ORBIT_CONTROL_PLANE_URL\\)"):
        provider.client()
    monkeypatch.setenv("ORBIT_CONTROL_PLANE_URL", "http://cp.example:8080/")
    monkeypatch.setenv("ORBIT_CLIENT_ID", "AKX")
    monkeypatch.setenv("ORBIT_CLIENT_SECRET", "s3cret")
    monkeypatch.setenv("ORBIT_TENANT", "acme")
    provider.configure_provider(Diagnostics(), {"endpoint": None})
    client = provider.client()
    assert client.endpoint == "http://cp.example:8080"
    assert "s3cret" not in repr(client)
    assert provider.tenant(None) == "acme"
    assert provider.tenant("other") == "other"
    diags = Diagnostics()
    provider.validate_config(diags, {"endpoint": "cp.example:8080"})
    assert diags.has_errors()


def test_unknown_configuration_is_an_error_only_when_used() -> None:
    provider = OrbitProvider()
    provider.configure_provider(Diagnostics(), {"endpoint": "http://x", "client_id": "AK", "client_secret": Unknown})
    with pytest.raises(ConfigurationError, match="not known yet"):
        provider.client()


def test_mirror_layout_and_cli_config(tmp_path: Path) -> None:
    config = mirror.install(tmp_path / "mirror", sys.executable)
    launcher = (
        tmp_path / "mirror/registry.terraform.io/orbit-mq/orbit" / VERSION / mirror.target_platform()
    ) / f"terraform-provider-orbit_v{VERSION}"
    assert launcher.stat().st_mode & stat.S_IXUSR
    text = launcher.read_text()
    assert f"exec {sys.executable} -m orbit_provider" in text
    assert str(mirror.PACKAGE_ROOT) in text
    hcl = config.read_text()
    assert f'path    = "{(tmp_path / "mirror").resolve()}"' in hcl
    assert 'include = ["registry.terraform.io/orbit-mq/orbit"]' in hcl
    assert 'exclude = ["registry.terraform.io/orbit-mq/orbit"]' in hcl
    assert mirror.target_platform() == f"{os.uname().sysname.lower()}_amd64" or os.uname().machine != "x86_64"


def test_mirror_refuses_a_python_without_the_framework(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="cannot run the provider"):
        mirror.install(tmp_path / "mirror", "/bin/false")
