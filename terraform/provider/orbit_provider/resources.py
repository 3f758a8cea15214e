"""The provider's resources: orbit_tenant, orbit_topic, orbit_consumer_group, orbit_credential,
orbit_acl, orbit_quota and orbit_broker_host_credential.

Every operation goes to the control plane's API; an error answer becomes a Terraform diagnostic
carrying the API's code and message. ``read`` answers what the API holds now, so a change made
outside Terraform (through the API, the CLI, another tool) shows in the next ``terraform plan``,
and a resource deleted outside Terraform is planned to be made again.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from typing import Any, ClassVar

from tf import types
from tf.blocks import SetNestedBlock
from tf.iface import (
    CreateContext,
    DeleteContext,
    ImportContext,
    PlanContext,
    ReadContext,
    Resource,
    State,
    UpdateContext,
    UpgradeContext,
)
from tf.schema import Attribute, Block, Schema
from tf.types import Unknown
from tf.utils import Diagnostics

from orbit_provider.client import ApiError, OrbitClient, quote
from orbit_provider.provider import ConfigurationError, OrbitProvider, known

LIMIT_FIELDS = (
    "publish_msgs_per_s",
    "publish_bytes_per_s",
    "consume_msgs_per_s",
    "consume_bytes_per_s",
    "max_topics",
    "max_queues",
    "storage_bytes",
    "max_retention_hours",
    "max_connections",
    "max_inflight_requests",
)


def attr(
    name: str,
    kind: Any,
    description: str,
    *,
    required: bool = False,
    optional: bool = False,
    computed: bool = False,
    replace: bool = False,
    sensitive: bool = False,
) -> Attribute:
    return Attribute(
        name,
        kind,
        description=description,
        required=required,
        optional=optional,
        computed=computed,
        requires_replace=replace,
        sensitive=sensitive,
    )


def _id(description: str) -> Attribute:
    return attr("id", types.String(), description, computed=True)


def _tenant_attr() -> Attribute:
    return attr(
        "tenant",
        types.String(),
        "The tenant (default: the provider's tenant, else the credential's own). Changing it replaces the resource.",
        optional=True,
        computed=True,
        replace=True,
    )


def _split_id(value: str, provider: OrbitProvider, what: str) -> tuple[str, str]:
    """``tenant/name`` (or ``name`` in the provider's default tenant)."""
    tenant, sep, name = value.partition("/")
    if not sep:
        return provider.tenant(None), value
    if not tenant or not name:
        raise ConfigurationError(f"import id {value!r} is not {what}")
    return tenant, name


def _set(planned: State, key: str) -> Any:
    """A planned value the user set (None for unset or not yet known)."""
    value = planned.get(key)
    return value if known(value) else None


class OrbitResource(Resource):  # type: ignore[misc]  # tf has no type information
    """Common plumbing: API errors become diagnostics; a failed update or delete keeps the prior
    state (so the next run retries), a failed create stores nothing."""

    name: ClassVar[str]
    # changed field -> computed fields whose new value is only known after the apply
    VOLATILE: ClassVar[dict[str, tuple[str, ...]]] = {}

    def __init__(self, provider: OrbitProvider) -> None:
        self.provider = provider

    @classmethod
    def get_name(cls) -> str:
        return cls.name

    @property
    def api(self) -> OrbitClient:
        return self.provider.client()

    def _guard(self, diags: Diagnostics, op: Callable[[], State | None], fallback: State | None) -> State | None:
        try:
            return op()
        except ApiError as e:
            diags.add_error(e.summary, e.detail)
        except ConfigurationError as e:
            diags.add_error("Orbit provider configuration", str(e))
        return fallback

    def create(self, ctx: CreateContext, planned: State) -> State | None:
        return self._guard(ctx.diagnostics, lambda: self._create(ctx.diagnostics, planned), None)

    def read(self, ctx: ReadContext, current: State) -> State | None:
        return self._guard(ctx.diagnostics, lambda: self._read(current), current)

    def update(self, ctx: UpdateContext, current: State, planned: State) -> State | None:
        return self._guard(ctx.diagnostics, lambda: self._update(ctx.diagnostics, current, planned), current)

    def delete(self, ctx: DeleteContext, current: State) -> State | None:
        return self._guard(ctx.diagnostics, lambda: self._delete(current), current)

    def import_(self, ctx: ImportContext, id: str) -> State | None:
        state = self._guard(ctx.diagnostics, lambda: self._import(id), None)
        if state is None and not ctx.diagnostics.has_errors():
            ctx.diagnostics.add_error(f"Cannot import {ctx.type_name}", f"no {self.name} {id!r} in the control plane")
        return state

    def upgrade(self, ctx: UpgradeContext, version: int, old: State) -> State | None:
        return old  # schema version 0 is the only one so far

    def plan(self, ctx: PlanContext, current: State | None, planned: State) -> State | None:
        for changed in ctx.changed_fields:
            for key in self.VOLATILE.get(changed, ()):
                planned[key] = Unknown
        return planned

    def _create(self, diags: Diagnostics, planned: State) -> State | None:
        raise NotImplementedError

    def _read(self, current: State) -> State | None:
        raise NotImplementedError

    def _update(self, diags: Diagnostics, current: State, planned: State) -> State | None:
        raise NotImplementedError

    def _delete(self, current: State) -> None:
        raise NotImplementedError

    def _import(self, id: str) -> State | None:
        raise NotImplementedError


def _exists(diags: Diagnostics, what: str, wire_name: str, import_id: str) -> None:
    """The API's idempotent 200 to a create: the resource existed before this apply."""
    diags.add_error(
        f"{what} {wire_name} exists already",
        f"it was made outside this Terraform state; import it: terraform import <address> {import_id}",
    )


def _delete_quietly(client: OrbitClient, path: str) -> None:
    """DELETE; already gone is fine."""
    try:
        client.call("DELETE", path)
    except ApiError as e:
        if e.status != 404:
            raise


# --- orbit_tenant ---------------------------------------------------------------------------------
class Tenant(OrbitResource):
    """A tenant (operator credential). Destroying it deletes its topics and groups and revokes its
    credentials; its id stays taken."""

    name = "tenant"
    VOLATILE: ClassVar[dict[str, tuple[str, ...]]] = {}

    @classmethod
    def get_schema(cls) -> Schema:
        return Schema(
            description="An Orbit tenant (needs an operator credential).",
            attributes=[
                _id("The tenant id (same as name)."),
                attr(
                    "name",
                    types.String(),
                    "Tenant id: ^[a-z][a-z0-9-]{1,30}[a-z0-9]$. Changing it replaces the tenant; a deleted "
                    "tenant's id cannot be used again.",
                    required=True,
                    replace=True,
                ),
                attr("display_name", types.String(), "Display name.", optional=True, computed=True),
                attr("plan", types.String(), "Plan (free, standard, enterprise, ...).", optional=True, computed=True),
                attr(
                    "suspended",
                    types.Bool(),
                    "Suspend the tenant: no new tokens, its API refused, brokers refuse it.",
                    optional=True,
                    computed=True,
                ),
                attr("status", types.String(), "active or suspended.", computed=True),
                attr("created_at", types.String(), "When it was made (ISO 8601).", computed=True),
            ],
        )

    @staticmethod
    def _state(t: dict[str, Any]) -> State:
        return {
            "id": t["id"],
            "name": t["id"],
            "display_name": t["display_name"],
            "plan": t["plan"],
            "suspended": t["status"] == "suspended",
            "status": t["status"],
            "created_at": t["created_at"],
        }

    def plan(self, ctx: PlanContext, current: State | None, planned: State) -> State | None:
        if known(planned.get("suspended")):
            planned["status"] = "suspended" if planned["suspended"] else "active"
        return planned

    def _create(self, diags: Diagnostics, planned: State) -> State | None:
        body: dict[str, Any] = {"id": planned["name"]}
        for key in ("display_name", "plan"):
            if _set(planned, key) is not None:
                body[key] = planned[key]
        _status, made = self.api.call("POST", "/v1/tenants", body)
        if _set(planned, "suspended"):
            _status, made = self.api.call("POST", f"/v1/tenants/{quote(made['id'])}/suspend")
        return self._state(made)

    def _read(self, current: State) -> State | None:
        got = self.api.get_or_none(f"/v1/tenants/{quote(current['name'])}")
        return None if got is None else self._state(got)

    def _update(self, diags: Diagnostics, current: State, planned: State) -> State | None:
        path = f"/v1/tenants/{quote(current['name'])}"
        changes = {
            k: planned[k] for k in ("display_name", "plan") if known(planned.get(k)) and planned[k] != current[k]
        }
        if changes:
            self.api.call("PATCH", path, changes)
        if known(planned.get("suspended")) and planned["suspended"] != current["suspended"]:
            self.api.call("POST", path + ("/suspend" if planned["suspended"] else "/resume"))
        return self._state(self.api.get(path))

    def _delete(self, current: State) -> None:
        _delete_quietly(self.api, f"/v1/tenants/{quote(current['name'])}")

    def _import(self, id: str) -> State | None:
        got = self.api.get_or_none(f"/v1/tenants/{quote(id)}")
        return None if got is None else self._state(got)


# --- orbit_topic ----------------------------------------------------------------------------------
class Topic(OrbitResource):
    name = "topic"
    VOLATILE: ClassVar[dict[str, tuple[str, ...]]] = {
        "throughput_hint_msgs_per_s": ("queue_count", "placements", "status"),
    }

    @classmethod
    def get_schema(cls) -> Schema:
        return Schema(
            description="A topic of a tenant. The control plane picks its queues and broker groups.",
            attributes=[
                _id("tenant/name."),
                _tenant_attr(),
                attr("name", types.String(), "Topic name: ^[A-Za-z0-9_-]{1,64}$.", required=True, replace=True),
                attr(
                    "message_type",
                    types.String(),
                    "NORMAL (default), FIFO, DELAY or TRANSACTION. Changing it replaces the topic.",
                    optional=True,
                    computed=True,
                    replace=True,
                ),
                attr(
                    "retention_hours",
                    types.Number(),
                    "Messages are kept at least this long (default min(72, the plan's maximum)).",
                    optional=True,
                    computed=True,
                ),
                attr(
                    "throughput_hint_msgs_per_s",
                    types.Number(),
                    "Expected messages per second: queues = max(4, ceil(hint / 1000)), capped by the plan. "
                    "A larger hint adds queues; queues are never removed.",
                    optional=True,
                    computed=True,
                ),
                attr("description", types.String(), "Free text.", optional=True, computed=True),
                attr("wire_name", types.String(), "The name clients use: tenant%name.", computed=True),
                attr("queue_count", types.Number(), "Queues of the topic.", computed=True),
                attr(
                    "placements",
                    types.Map(types.Number()),
                    "Queues per broker group.",
                    computed=True,
                ),
                attr("status", types.String(), "provisioning or active (on every broker group).", computed=True),
            ],
        )

    @staticmethod
    def _state(t: dict[str, Any]) -> State:
        return {
            "id": f"{t['tenant_id']}/{t['name']}",
            "tenant": t["tenant_id"],
            "name": t["name"],
            "message_type": t["message_type"],
            "retention_hours": t["retention_hours"],
            "throughput_hint_msgs_per_s": t["throughput_hint_msgs_per_s"],
            "description": t["description"],
            "wire_name": t["wire_name"],
            "queue_count": t["queue_count"],
            "placements": {p["broker_group"]: p["queue_count"] for p in t.get("placements", [])},
            "status": t["status"],
        }

    def _path(self, tenant: str, name: str) -> str:
        return f"/v1/tenants/{quote(tenant)}/topics/{quote(name)}"

    def _wait_active(self, diags: Diagnostics, topic: dict[str, Any]) -> dict[str, Any]:
        deadline = time.monotonic() + self.provider.wait_for_active_s
        path = self._path(topic["tenant_id"], topic["name"])
        while topic["status"] != "active" and time.monotonic() < deadline:
            time.sleep(0.25)
            topic = self.api.get(path)
        if topic["status"] != "active" and self.provider.wait_for_active_s > 0:
            diags.add_warning(
                f"Topic {topic['wire_name']} is still {topic['status']}",
                f"its queues were not on every broker group within {self.provider.wait_for_active_s:.0f} s; "
                "the control plane keeps reconciling (see wait_for_active_s)",
            )
        return topic

    def _create(self, diags: Diagnostics, planned: State) -> State | None:
        tenant = self.provider.tenant(planned.get("tenant"))
        body: dict[str, Any] = {"name": planned["name"]}
        for key in ("message_type", "retention_hours", "throughput_hint_msgs_per_s", "description"):
            if _set(planned, key) is not None:
                body[key] = planned[key]
        status, made = self.api.call("POST", f"/v1/tenants/{quote(tenant)}/topics", body)
        if status == 200:
            _exists(diags, "Topic", made["wire_name"], f"{tenant}/{made['name']}")
            return None
        return self._state(self._wait_active(diags, made))

    def _read(self, current: State) -> State | None:
        got = self.api.get_or_none(self._path(current["tenant"], current["name"]))
        return None if got is None else self._state(got)

    def _update(self, diags: Diagnostics, current: State, planned: State) -> State | None:
        changes = {
            k: planned[k]
            for k in ("retention_hours", "throughput_hint_msgs_per_s", "description")
            if known(planned.get(k)) and planned[k] != current.get(k)
        }
        path = self._path(current["tenant"], current["name"])
        topic = self.api.call("PATCH", path, changes)[1] if changes else self.api.get(path)
        return self._state(self._wait_active(diags, topic))

    def _delete(self, current: State) -> None:
        _delete_quietly(self.api, self._path(current["tenant"], current["name"]))

    def _import(self, id: str) -> State | None:
        tenant, name = _split_id(id, self.provider, "tenant/topic")
        got = self.api.get_or_none(self._path(tenant, name))
        return None if got is None else self._state(got)


# --- orbit_consumer_group -------------------------------------------------------------------------
GROUP_SPEC = ("retry_policy", "fixed_interval_ms", "max_retries", "consume_orderly", "description")


class ConsumerGroup(OrbitResource):
    name = "consumer_group"

    @classmethod
    def get_schema(cls) -> Schema:
        return Schema(
            description="A consumer group of a tenant, with its retry policy.",
            attributes=[
                _id("tenant/name."),
                _tenant_attr(),
                attr("name", types.String(), "Group name: ^[A-Za-z0-9_-]{1,64}$.", required=True, replace=True),
                attr(
                    "retry_policy",
                    types.String(),
                    "exponential (RocketMQ's delay levels, default) or fixed (every fixed_interval_ms).",
                    optional=True,
                    computed=True,
                ),
                attr(
                    "fixed_interval_ms",
                    types.Number(),
                    "Retry interval of the fixed policy.",
                    optional=True,
                    computed=True,
                ),
                attr(
                    "max_retries",
                    types.Number(),
                    "Redeliveries before a message goes to the dead-letter topic (default 16).",
                    optional=True,
                    computed=True,
                ),
                attr("consume_orderly", types.Bool(), "Orderly consumption.", optional=True, computed=True),
                attr("description", types.String(), "Free text.", optional=True, computed=True),
                attr("wire_name", types.String(), "The name clients use: tenant%name.", computed=True),
                attr("retry_topic", types.String(), "%RETRY%tenant%name.", computed=True),
                attr("dlq_topic", types.String(), "%DLQ%tenant%name (dead letters).", computed=True),
            ],
        )

    @staticmethod
    def _state(g: dict[str, Any]) -> State:
        return {
            "id": f"{g['tenant_id']}/{g['name']}",
            "tenant": g["tenant_id"],
            "name": g["name"],
            **{k: g[k] for k in GROUP_SPEC},
            "wire_name": g["wire_name"],
            "retry_topic": g["retry_topic"],
            "dlq_topic": g["dlq_topic"],
        }

    def _path(self, tenant: str, name: str) -> str:
        return f"/v1/tenants/{quote(tenant)}/groups/{quote(name)}"

    def _create(self, diags: Diagnostics, planned: State) -> State | None:
        tenant = self.provider.tenant(planned.get("tenant"))
        body: dict[str, Any] = {"name": planned["name"]}
        body.update({k: planned[k] for k in GROUP_SPEC if _set(planned, k) is not None})
        status, made = self.api.call("POST", f"/v1/tenants/{quote(tenant)}/groups", body)
        if status == 200:
            _exists(diags, "Consumer group", made["wire_name"], f"{tenant}/{made['name']}")
            return None
        return self._state(made)

    def _read(self, current: State) -> State | None:
        got = self.api.get_or_none(self._path(current["tenant"], current["name"]))
        return None if got is None else self._state(got)

    def _update(self, diags: Diagnostics, current: State, planned: State) -> State | None:
        changes = {k: planned[k] for k in GROUP_SPEC if known(planned.get(k)) and planned[k] != current.get(k)}
        path = self._path(current["tenant"], current["name"])
        return self._state(self.api.call("PATCH", path, changes)[1] if changes else self.api.get(path))

    def _delete(self, current: State) -> None:
        _delete_quietly(self.api, self._path(current["tenant"], current["name"]))

    def _import(self, id: str) -> State | None:
        tenant, name = _split_id(id, self.provider, "tenant/group")
        got = self.api.get_or_none(self._path(tenant, name))
        return None if got is None else self._state(got)


# --- orbit_credential -----------------------------------------------------------------------------
ROLES = ("tenant", "operator", "broker")


def _write_secret_file(path: str, access_key: str, secret: str) -> None:
    path = os.path.expanduser(path)
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, mode=0o700, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps({"access_key": access_key, "secret": secret}) + "\n")
    os.chmod(path, 0o600)


def _remove_secret_file(path: str, access_key: str) -> None:
    """Remove the file this credential's secret went to, if it still holds that credential."""
    path = os.path.expanduser(path)
    try:
        with open(path) as f:
            held = json.load(f)
    except (OSError, ValueError):
        return
    if isinstance(held, dict) and held.get("access_key") == access_key:
        os.unlink(path)


class Credential(OrbitResource):
    """A credential (access key and secret). A tenant credential made here starts with no grants:
    give it some with orbit_acl. The secret is known only when the credential is made."""

    name = "credential"

    @classmethod
    def get_schema(cls) -> Schema:
        return Schema(
            description="A credential: access key (client id) and secret. Tenant credentials start without "
            "grants (see orbit_acl); operator and broker credentials need an operator credential.",
            attributes=[
                _id("The access key."),
                attr(
                    "tenant",
                    types.String(),
                    "Tenant of a tenant credential (default: the provider's tenant, else the credential's own); "
                    "null for operator and broker credentials.",
                    optional=True,
                    computed=True,
                    replace=True,
                ),
                attr(
                    "role",
                    types.String(),
                    "tenant (default), operator or broker. Changing it makes a new credential.",
                    optional=True,
                    computed=True,
                    replace=True,
                ),
                attr(
                    "description",
                    types.String(),
                    "Free text. Changing it makes a new credential.",
                    optional=True,
                    computed=True,
                    replace=True,
                ),
                attr(
                    "secret_file",
                    types.String(),
                    "Write {access_key, secret} to this file (mode 0600) instead of keeping the secret in "
                    "the Terraform state; secret is then null.",
                    optional=True,
                    replace=True,
                ),
                attr("access_key", types.String(), "The access key (client id).", computed=True),
                attr(
                    "secret",
                    types.String(),
                    "The secret, known only from the apply that made the credential (null when imported or "
                    "when secret_file is set).",
                    computed=True,
                    sensitive=True,
                ),
                attr("status", types.String(), "active (a revoked credential is gone).", computed=True),
                attr("created_at", types.String(), "When it was made (ISO 8601).", computed=True),
            ],
        )

    @staticmethod
    def _state(c: dict[str, Any], *, secret: Any, secret_file: Any) -> State:
        return {
            "id": c["access_key"],
            "tenant": c.get("tenant_id"),
            "role": c["role"],
            "description": c["description"],
            "secret_file": secret_file,
            "access_key": c["access_key"],
            "secret": secret,
            "status": c["status"],
            "created_at": c["created_at"],
        }

    def _list_path(self, role: str, tenant: str | None) -> str:
        return "/v1/admin/credentials" if role != "tenant" else f"/v1/tenants/{quote(tenant or '')}/credentials"

    def _find(self, role: str, tenant: str | None, access_key: str) -> dict[str, Any] | None:
        listed = self.api.get_or_none(self._list_path(role, tenant))
        for c in (listed or {}).get("credentials", []):
            if c["access_key"] == access_key and c["status"] == "active":
                return dict(c)
        return None

    def _create(self, diags: Diagnostics, planned: State) -> State | None:
        role = _set(planned, "role") or "tenant"
        if role not in ROLES:
            diags.add_error("Invalid role", f"role must be one of {', '.join(ROLES)}", path=["role"])
            return None
        description = _set(planned, "description") or ""
        if role == "tenant":
            tenant = self.provider.tenant(planned.get("tenant"))
            body: dict[str, Any] = {"grants": [], "description": description}
            _status, made = self.api.call("POST", self._list_path(role, tenant), body)
        else:
            if _set(planned, "tenant"):
                diags.add_error("Invalid tenant", f"a {role} credential belongs to no tenant", path=["tenant"])
                return None
            _status, made = self.api.call("POST", "/v1/admin/credentials", {"role": role, "description": description})
        secret_file = _set(planned, "secret_file")
        secret: str | None = made.pop("secret")
        if secret_file:
            _write_secret_file(secret_file, made["access_key"], secret or "")
            secret = None
        return self._state(made, secret=secret, secret_file=secret_file)

    def _read(self, current: State) -> State | None:
        got = self._find(current["role"], current.get("tenant"), current["access_key"])
        if got is None:
            return None
        return self._state(got, secret=current.get("secret"), secret_file=current.get("secret_file"))

    def _update(self, diags: Diagnostics, current: State, planned: State) -> State | None:
        return {**current, **{k: v for k, v in planned.items() if known(v)}}  # nothing changes in place

    def _delete(self, current: State) -> None:
        path = self._list_path(current["role"], current.get("tenant"))
        _delete_quietly(self.api, f"{path}/{quote(current['access_key'])}")
        if current.get("secret_file"):
            _remove_secret_file(current["secret_file"], current["access_key"])

    def _import(self, id: str) -> State | None:
        tenant, sep, access_key = id.rpartition("/")
        got = self._find("tenant", tenant, access_key) if sep else self._find("operator", None, access_key)
        return None if got is None else self._state(got, secret=None, secret_file=None)


# --- orbit_acl ------------------------------------------------------------------------------------
class Acl(OrbitResource):
    """The grants of one credential (RocketMQ's ACL): authoritative, so a grant added outside
    Terraform shows as a change to remove."""

    name = "acl"

    @classmethod
    def get_schema(cls) -> Schema:
        grant = Block(
            attributes=[
                attr("resource", types.String(), "topic or group.", required=True),
                attr(
                    "pattern",
                    types.String(),
                    "A name, a prefix followed by * (orders-*), or * (all of the tenant's).",
                    required=True,
                ),
                attr("actions", types.Set(types.String()), "Of publish, subscribe, admin.", required=True),
            ],
            description="One grant.",
        )
        return Schema(
            description="What one tenant credential may do (its grants). Destroying it leaves the credential "
            "with no grants.",
            attributes=[
                _id("tenant/access_key."),
                _tenant_attr(),
                attr("access_key", types.String(), "The credential's access key.", required=True, replace=True),
            ],
            block_types=[SetNestedBlock("grant", grant)],
        )

    @staticmethod
    def _grants(planned: State) -> list[dict[str, Any]]:
        return [
            {"resource": g["resource"], "pattern": g["pattern"], "actions": sorted(g["actions"] or [])}
            for g in planned.get("grant") or []
        ]

    @staticmethod
    def _state(tenant: str, access_key: str, grants: list[dict[str, Any]]) -> State:
        return {
            "id": f"{tenant}/{access_key}",
            "tenant": tenant,
            "access_key": access_key,
            "grant": [
                {"resource": g["resource"], "pattern": g["pattern"], "actions": sorted(g["actions"])} for g in grants
            ],
        }

    def _put(self, tenant: str, access_key: str, grants: list[dict[str, Any]]) -> State:
        path = f"/v1/tenants/{quote(tenant)}/credentials/{quote(access_key)}/grants"
        _status, updated = self.api.call("PUT", path, {"grants": grants})
        return self._state(tenant, access_key, updated["grants"])

    def _create(self, diags: Diagnostics, planned: State) -> State | None:
        tenant = self.provider.tenant(planned.get("tenant"))
        return self._put(tenant, planned["access_key"], self._grants(planned))

    def _fetch(self, tenant: str, access_key: str) -> State | None:
        listed = self.api.get_or_none(f"/v1/tenants/{quote(tenant)}/acls")
        for acl in (listed or {}).get("acls", []):
            if acl["access_key"] == access_key:
                return self._state(tenant, access_key, acl["grants"])
        return None

    def _read(self, current: State) -> State | None:
        return self._fetch(current["tenant"], current["access_key"])

    def _update(self, diags: Diagnostics, current: State, planned: State) -> State | None:
        return self._put(current["tenant"], current["access_key"], self._grants(planned))

    def _delete(self, current: State) -> None:
        try:
            self._put(current["tenant"], current["access_key"], [])
        except ApiError as e:
            if e.status != 404:  # the credential itself is gone
                raise

    def _import(self, id: str) -> State | None:
        tenant, access_key = _split_id(id, self.provider, "tenant/access_key")
        return self._fetch(tenant, access_key)


# --- orbit_quota ----------------------------------------------------------------------------------
class Quota(OrbitResource):
    """A tenant's quota overrides (operator credential): authoritative, a limit left out (null)
    falls back to the tenant's plan."""

    name = "quota"
    VOLATILE: ClassVar[dict[str, tuple[str, ...]]] = dict.fromkeys(LIMIT_FIELDS, ("effective",))

    @classmethod
    def get_schema(cls) -> Schema:
        limits = [
            attr(f, types.Number(), f"Override of the plan's {f} (null: the plan's).", optional=True)
            for f in LIMIT_FIELDS
        ]
        return Schema(
            description="Quota overrides of a tenant (needs an operator credential). Destroying it returns the "
            "tenant to its plan's limits.",
            attributes=[
                _id("The tenant."),
                attr("tenant", types.String(), "The tenant.", required=True, replace=True),
                *limits,
                attr("plan", types.String(), "The tenant's plan.", computed=True),
                attr(
                    "effective",
                    types.Map(types.Number()),
                    "The limits in force (overrides, else the plan's).",
                    computed=True,
                ),
            ],
        )

    @staticmethod
    def _state(q: dict[str, Any]) -> State:
        overrides = q.get("overrides") or {}
        return {
            "id": q["tenant_id"],
            "tenant": q["tenant_id"],
            **{f: overrides.get(f) for f in LIMIT_FIELDS},
            "plan": q["plan"],
            "effective": dict(q["effective"]),
        }

    def _path(self, tenant: str) -> str:
        return f"/v1/tenants/{quote(tenant)}/quota"

    def _put(self, tenant: str, planned: State) -> State:
        body = {f: _set(planned, f) for f in LIMIT_FIELDS}
        return self._state(self.api.call("PUT", self._path(tenant), body)[1])

    def _create(self, diags: Diagnostics, planned: State) -> State | None:
        return self._put(planned["tenant"], planned)

    def _read(self, current: State) -> State | None:
        got = self.api.get_or_none(self._path(current["tenant"]))
        return None if got is None else self._state(got)

    def _update(self, diags: Diagnostics, current: State, planned: State) -> State | None:
        return self._put(current["tenant"], planned)

    def _delete(self, current: State) -> None:
        try:
            self._put(current["tenant"], {})
        except ApiError as e:
            if e.status != 404:  # the tenant is gone, and its overrides with it
                raise

    def _import(self, id: str) -> State | None:
        got = self.api.get_or_none(self._path(id))
        return None if got is None else self._state(got)


# --- orbit_broker_host_credential -----------------------------------------------------------------
class BrokerHostCredential(OrbitResource):
    """The broker credential of one host of a broker group (operator credential): the host is the
    host part of one of the group's broker_addrs. Made by issuing (which revokes the host's previous
    credential), destroyed by revoking — only while it is still the host's current credential, so
    destroying a replaced one revokes nothing. A credential that is no longer the host's active one
    (revoked or rotated outside Terraform, or its host left broker_addrs) is planned to be made
    again. The secret is known only from the apply that made it."""

    name = "broker_host_credential"

    @classmethod
    def get_schema(cls) -> Schema:
        return Schema(
            description="The broker credential of one host of a broker group (needs an operator credential); "
            "feed it to the host's broker_credentials_file.",
            attributes=[
                _id("broker_group/host."),
                attr("broker_group", types.String(), "The broker group.", required=True, replace=True),
                attr(
                    "host",
                    types.String(),
                    "The host: the host part of one of the group's broker_addrs (10.0.0.1, or fd00::2 of "
                    "[fd00::2]:10911).",
                    required=True,
                    replace=True,
                ),
                attr("access_key", types.String(), "The access key (client id).", computed=True),
                attr(
                    "secret",
                    types.String(),
                    "The secret, known only from the apply that made the credential (null when imported).",
                    computed=True,
                    sensitive=True,
                ),
                attr("status", types.String(), "active (a revoked or replaced credential is gone).", computed=True),
                attr("created_at", types.String(), "When it was made (ISO 8601).", computed=True),
            ],
        )

    @staticmethod
    def _state(broker_group: str, h: dict[str, Any], *, secret: Any) -> State:
        return {
            "id": f"{broker_group}/{h['host']}",
            "broker_group": broker_group,
            "host": h["host"],
            "access_key": h["access_key"],
            "secret": secret,
            "status": h["status"],
            "created_at": h["created_at"],
        }

    def _path(self, broker_group: str, host: str) -> str:
        return f"/v1/fleet/broker-groups/{quote(broker_group)}/hosts/{quote(host)}/credential"

    def _current(self, broker_group: str, host: str) -> dict[str, Any] | None:
        """The host's entry when it has an active credential."""
        listed = self.api.get_or_none(f"/v1/fleet/broker-groups/{quote(broker_group)}/hosts")
        for h in (listed or {}).get("hosts", []):
            if h["host"] == host and h["status"] == "active":
                return dict(h)
        return None

    def _create(self, diags: Diagnostics, planned: State) -> State | None:
        _status, made = self.api.call("POST", self._path(planned["broker_group"], planned["host"]))
        return self._state(planned["broker_group"], made, secret=made.pop("secret"))

    def _read(self, current: State) -> State | None:
        got = self._current(current["broker_group"], current["host"])
        if got is None or got["access_key"] != current["access_key"]:
            return None
        return self._state(current["broker_group"], got, secret=current.get("secret"))

    def _update(self, diags: Diagnostics, current: State, planned: State) -> State | None:
        return {**current, **{k: v for k, v in planned.items() if known(v)}}  # nothing changes in place

    def _delete(self, current: State) -> None:
        got = self._current(current["broker_group"], current["host"])
        if got is not None and got["access_key"] == current["access_key"]:
            _delete_quietly(self.api, self._path(current["broker_group"], current["host"]))

    def _import(self, id: str) -> State | None:
        broker_group, sep, host = id.partition("/")
        if not sep or not broker_group or not host:
            raise ConfigurationError(f"import id {id!r} is not broker_group/host")
        got = self._current(broker_group, host)
        return None if got is None else self._state(broker_group, got, secret=None)


RESOURCES: tuple[type[OrbitResource], ...] = (
    Tenant,
    Topic,
    ConsumerGroup,
    Credential,
    Acl,
    Quota,
    BrokerHostCredential,
)
