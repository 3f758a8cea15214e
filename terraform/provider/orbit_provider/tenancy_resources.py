"""The resources a tenant's messaging is made of: orbit_tenant, orbit_topic and
orbit_consumer_group."""

from __future__ import annotations

import time
from typing import Any, ClassVar

from tf import types
from tf.iface import (
    Config,
    PlanContext,
    State,
)
from tf.schema import Schema
from tf.types import Unknown
from tf.utils import Diagnostics

from orbit_provider.client import quote
from orbit_provider.provider import known
from orbit_provider.resource_base import (
    OrbitResource,
    attr,
    delete_quietly,
    exists_already,
    id_attr,
    split_id,
    tenant_attr,
    user_set,
)


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
                id_attr("The tenant id (same as name)."),
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
            if user_set(planned, key) is not None:
                body[key] = planned[key]
        _status, made = self.api.call("POST", "/v1/tenants", body)
        if user_set(planned, "suspended"):
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
        delete_quietly(self.api, f"/v1/tenants/{quote(current['name'])}")

    def _import(self, id: str) -> State | None:
        got = self.api.get_or_none(f"/v1/tenants/{quote(id)}")
        return None if got is None else self._state(got)


# --- orbit_topic ----------------------------------------------------------------------------------
MAX_RETENTION_HOURS = 8760  # the API's bound of retention_hours and local_retention_hours: a year
UNLIMITED = "unlimited"  # the API's retention_hours of a topic that keeps its messages for good


def _hours_problem(value: Any) -> str | None:
    """Why ``value`` is not hours the API takes (None: it is)."""
    whole = isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    if isinstance(value, bool) or not whole or not 1 <= value <= MAX_RETENTION_HOURS:
        return f"must be a whole number of hours within 1..{MAX_RETENTION_HOURS}"
    return None


def _retention(state: State) -> int | str | None:
    """The API's retention_hours of a state: hours, "unlimited", or None (not known: the API's)."""
    if state.get("unlimited_retention") is True:
        return UNLIMITED
    hours = state.get("retention_hours")
    return int(hours) if known(hours) else None


class Topic(OrbitResource):
    """A topic. Retention is in two tiers: ``retention_hours`` (or ``unlimited_retention``) is the
    total, ``local_retention_hours`` the part on the brokers' own disks. The two ways to say the
    total exclude each other: the configuration sets at most one, and the plan derives the other
    (hours end unlimited retention; unlimited retention has no hours)."""

    name = "topic"
    VOLATILE: ClassVar[dict[str, tuple[str, ...]]] = {
        "throughput_hint_msgs_per_s": ("queue_count", "placements", "status"),
    }

    @classmethod
    def get_schema(cls) -> Schema:
        return Schema(
            description="A topic of a tenant. The control plane picks its queues and broker groups.",
            attributes=[
                id_attr("tenant/name."),
                tenant_attr(),
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
                    f"Messages are kept at least this long, on brokers' disks and in object storage together: "
                    f"1..{MAX_RETENTION_HOURS}, at most the plan's max_retention_hours (default min(72, that)). "
                    "Null while unlimited_retention is true; setting it ends unlimited retention.",
                    optional=True,
                    computed=True,
                ),
                attr(
                    "unlimited_retention",
                    types.Bool(),
                    'Keep the messages for good (the API\'s retention_hours "unlimited"; needs a plan or quota '
                    "with unlimited_retention). Conflicts with retention_hours.",
                    optional=True,
                    computed=True,
                ),
                attr(
                    "local_retention_hours",
                    types.Number(),
                    f"How long brokers keep the messages on their own disks too, before only object storage has "
                    f"them: 1..{MAX_RETENTION_HOURS}, at most a finite retention_hours (null: the broker's "
                    "local_retention_hours).",
                    optional=True,
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
            "retention_hours": None if t["retention_hours"] == UNLIMITED else t["retention_hours"],
            "unlimited_retention": t["retention_hours"] == UNLIMITED,
            "local_retention_hours": t.get("local_retention_hours"),
            "throughput_hint_msgs_per_s": t["throughput_hint_msgs_per_s"],
            "description": t["description"],
            "wire_name": t["wire_name"],
            "queue_count": t["queue_count"],
            "placements": {p["broker_group"]: p["queue_count"] for p in t.get("placements", [])},
            "status": t["status"],
        }

    def validate(self, diags: Diagnostics, type_name: str, config: Config) -> None:
        """Plan-time checks of the configuration (unknown values are checked once known)."""
        super().validate(diags, type_name, config)
        hours, local = config.get("retention_hours"), config.get("local_retention_hours")
        unlimited = config.get("unlimited_retention")
        valid = True
        for key, value in (("retention_hours", hours), ("local_retention_hours", local)):
            if known(value) and (problem := _hours_problem(value)) is not None:
                diags.add_error(f"Invalid {key}", f"{key} = {value}: {problem}", path=[key])
                valid = False
        if hours is not None and (unlimited is True or unlimited is Unknown):
            diags.add_error(
                "Conflicting retention",
                "unlimited_retention = true keeps the messages for good and retention_hours keeps them for "
                "a number of hours: set one of them"
                if unlimited is True
                else "unlimited_retention is known only after apply, so retention_hours may conflict with it: "
                "leave retention_hours out, or make unlimited_retention known at plan time",
                path=["retention_hours"],
            )
        elif valid:
            _check_local(diags, hours, local)

    def plan(self, ctx: PlanContext, current: State | None, planned: State) -> State | None:
        """An update's plan (a create's needs none): the total said one way derives the other."""
        planned = super().plan(ctx, current, planned)
        changed, unlimited = ctx.changed_fields, planned.get("unlimited_retention")
        if unlimited is Unknown:  # then retention_hours is not in the configuration (validate)
            planned["retention_hours"] = Unknown
        elif unlimited is True and "unlimited_retention" in changed:
            planned["retention_hours"] = None  # kept for good: no hours
        elif "retention_hours" in changed and planned.get("retention_hours") is not None:
            planned["unlimited_retention"] = False  # hours end unlimited retention
        elif unlimited is False and planned.get("retention_hours") is None:
            ctx.diagnostics.add_error(
                "Ending unlimited retention needs retention_hours",
                f"topic {planned.get('name')} keeps its messages for good; with unlimited_retention = false set "
                "retention_hours to the hours to keep them",
                path=["retention_hours"],
            )
        # e.g. retention_hours lowered under a local retention the configuration keeps
        _check_local(ctx.diagnostics, planned.get("retention_hours"), planned.get("local_retention_hours"))
        return planned

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
        for key in ("message_type", "throughput_hint_msgs_per_s", "description"):
            if user_set(planned, key) is not None:
                body[key] = planned[key]
        if (retention := _retention(planned)) is not None:
            body["retention_hours"] = retention
        if (local := planned.get("local_retention_hours")) is not None:
            body["local_retention_hours"] = int(local)
        status, made = self.api.call("POST", f"/v1/tenants/{quote(tenant)}/topics", body)
        if status == 200:
            exists_already(diags, "Topic", made["wire_name"], f"{tenant}/{made['name']}")
            return None
        return self._state(self._wait_active(diags, made))

    def _read(self, current: State) -> State | None:
        got = self.api.get_or_none(self._path(current["tenant"], current["name"]))
        return None if got is None else self._state(got)

    def _update(self, diags: Diagnostics, current: State, planned: State) -> State | None:
        changes: dict[str, Any] = {
            k: planned[k]
            for k in ("throughput_hint_msgs_per_s", "description")
            if known(planned.get(k)) and planned[k] != current.get(k)
        }
        retention = _retention(planned)
        if retention is not None and retention != _retention(current):
            changes["retention_hours"] = retention
        local = planned.get("local_retention_hours")
        if local != current.get("local_retention_hours"):
            changes["local_retention_hours"] = None if local is None else int(local)  # null: the broker's
        path = self._path(current["tenant"], current["name"])
        topic = self.api.call("PATCH", path, changes)[1] if changes else self.api.get(path)
        return self._state(self._wait_active(diags, topic))

    def _delete(self, current: State) -> None:
        delete_quietly(self.api, self._path(current["tenant"], current["name"]))

    def _import(self, id: str) -> State | None:
        tenant, name = split_id(id, self.provider, "tenant/topic")
        got = self.api.get_or_none(self._path(tenant, name))
        return None if got is None else self._state(got)


def _check_local(diags: Diagnostics, hours: Any, local: Any) -> None:
    """The local copy is part of the total: ``local`` within finite ``hours`` (unknown: unchecked)."""
    if known(hours) and known(local) and local > hours:
        diags.add_error(
            "Invalid local_retention_hours",
            f"local_retention_hours ({local}) must be at most retention_hours ({hours}): the brokers' copy is "
            "part of the total (lower it too, or leave it out for the broker's default)",
            path=["local_retention_hours"],
        )


# --- orbit_consumer_group -------------------------------------------------------------------------
GROUP_SPEC = ("retry_policy", "fixed_interval_ms", "max_retries", "consume_orderly", "description")


class ConsumerGroup(OrbitResource):
    name = "consumer_group"

    @classmethod
    def get_schema(cls) -> Schema:
        return Schema(
            description="A consumer group of a tenant, with its retry policy.",
            attributes=[
                id_attr("tenant/name."),
                tenant_attr(),
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
        body.update({k: planned[k] for k in GROUP_SPEC if user_set(planned, k) is not None})
        status, made = self.api.call("POST", f"/v1/tenants/{quote(tenant)}/groups", body)
        if status == 200:
            exists_already(diags, "Consumer group", made["wire_name"], f"{tenant}/{made['name']}")
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
        delete_quietly(self.api, self._path(current["tenant"], current["name"]))

    def _import(self, id: str) -> State | None:
        tenant, name = split_id(id, self.provider, "tenant/group")
        got = self.api.get_or_none(self._path(tenant, name))
        return None if got is None else self._state(got)
