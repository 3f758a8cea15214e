"""The resources of access and limits: orbit_credential (its secret written to a file, never
to the state), orbit_acl, orbit_quota and orbit_broker_host_credential."""

from __future__ import annotations

import json
import os
from typing import Any, ClassVar

from tf import types
from tf.blocks import SetNestedBlock
from tf.iface import (
    State,
)
from tf.schema import Block, Schema
from tf.utils import Diagnostics

from orbit_provider.client import ApiError, quote
from orbit_provider.provider import ConfigurationError, known
from orbit_provider.resource_base import (
    LIMIT_FIELDS,
    OrbitResource,
    attr,
    delete_quietly,
    id_attr,
    split_id,
    tenant_attr,
    user_set,
)

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


# --- orbit_credential -----------------------------------------------------------------------------
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
                id_attr("The access key."),
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
        role = user_set(planned, "role") or "tenant"
        if role not in ROLES:
            diags.add_error("Invalid role", f"role must be one of {', '.join(ROLES)}", path=["role"])
            return None
        description = user_set(planned, "description") or ""
        if role == "tenant":
            tenant = self.provider.tenant(planned.get("tenant"))
            body: dict[str, Any] = {"grants": [], "description": description}
            _status, made = self.api.call("POST", self._list_path(role, tenant), body)
        else:
            if user_set(planned, "tenant"):
                diags.add_error("Invalid tenant", f"a {role} credential belongs to no tenant", path=["tenant"])
                return None
            _status, made = self.api.call("POST", "/v1/admin/credentials", {"role": role, "description": description})
        secret_file = user_set(planned, "secret_file")
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
        delete_quietly(self.api, f"{path}/{quote(current['access_key'])}")
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
                id_attr("tenant/access_key."),
                tenant_attr(),
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
        tenant, access_key = split_id(id, self.provider, "tenant/access_key")
        return self._fetch(tenant, access_key)


# --- orbit_quota ----------------------------------------------------------------------------------
class Quota(OrbitResource):
    """A tenant's quota overrides (operator credential): authoritative, a limit left out (null)
    falls back to the tenant's plan."""

    name = "quota"
    VOLATILE: ClassVar[dict[str, tuple[str, ...]]] = {
        **dict.fromkeys(LIMIT_FIELDS, ("effective",)),
        "unlimited_retention": ("effective_unlimited_retention",),
    }

    @classmethod
    def get_schema(cls) -> Schema:
        limits = [
            attr(f, types.Number(), f"Override of the plan's {f} (null: the plan's).", optional=True)
            for f in LIMIT_FIELDS
        ]
        flag = attr(
            "unlimited_retention",
            types.Bool(),
            "Override of the plan's unlimited_retention: whether topics may keep their messages for good "
            "(null: the plan's).",
            optional=True,
        )
        return Schema(
            description="Quota overrides of a tenant (needs an operator credential). Destroying it returns the "
            "tenant to its plan's limits.",
            attributes=[
                id_attr("The tenant."),
                attr("tenant", types.String(), "The tenant.", required=True, replace=True),
                *limits,
                flag,
                attr("plan", types.String(), "The tenant's plan.", computed=True),
                attr(
                    "effective",
                    types.Map(types.Number()),
                    "The numeric limits in force (overrides, else the plan's); max_tiered_bytes only when "
                    "there is a cap.",
                    computed=True,
                ),
                attr(
                    "effective_unlimited_retention",
                    types.Bool(),
                    "Whether the tenant's topics may keep their messages for good (the override, else the plan's).",
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
            "unlimited_retention": overrides.get("unlimited_retention"),
            "plan": q["plan"],
            # A map of numbers: the flag (unlimited_retention) and a limit that is null (none) are left out.
            "effective": {k: v for k, v in q["effective"].items() if type(v) is int},
            "effective_unlimited_retention": q["effective"].get("unlimited_retention"),
        }

    def _path(self, tenant: str) -> str:
        return f"/v1/tenants/{quote(tenant)}/quota"

    def _put(self, tenant: str, planned: State) -> State:
        body = {f: user_set(planned, f) for f in (*LIMIT_FIELDS, "unlimited_retention")}
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
                id_attr("broker_group/host."),
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
            delete_quietly(self.api, self._path(current["broker_group"], current["host"]))

    def _import(self, id: str) -> State | None:
        broker_group, sep, host = id.partition("/")
        if not sep or not broker_group or not host:
            raise ConfigurationError(f"import id {id!r} is not broker_group/host")
        got = self._current(broker_group, host)
        return None if got is None else self._state(broker_group, got, secret=None)
