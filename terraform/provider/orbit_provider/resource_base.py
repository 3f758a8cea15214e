"""What every resource of the provider shares: ``OrbitResource`` (create, read, update, delete and
import through the control plane's API, an error answer as a Terraform diagnostic with the API's
code and message), the attribute helpers and the id helpers."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from tf import types
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
from tf.schema import Attribute
from tf.types import Unknown
from tf.utils import Diagnostics

from orbit_provider.client import ApiError, OrbitClient
from orbit_provider.provider import ConfigurationError, OrbitProvider, known

# The quota limits that are numbers (the API's plan fields less unlimited_retention, a flag).
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
    "max_tiered_bytes",
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


def id_attr(description: str) -> Attribute:
    return attr("id", types.String(), description, computed=True)


def tenant_attr() -> Attribute:
    return attr(
        "tenant",
        types.String(),
        "The tenant (default: the provider's tenant, else the credential's own). Changing it replaces the resource.",
        optional=True,
        computed=True,
        replace=True,
    )


def split_id(value: str, provider: OrbitProvider, what: str) -> tuple[str, str]:
    """``tenant/name`` (or ``name`` in the provider's default tenant)."""
    tenant, sep, name = value.partition("/")
    if not sep:
        return provider.tenant(None), value
    if not tenant or not name:
        raise ConfigurationError(f"import id {value!r} is not {what}")
    return tenant, name


def user_set(planned: State, key: str) -> Any:
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


def exists_already(diags: Diagnostics, what: str, wire_name: str, import_id: str) -> None:
    """The API's idempotent 200 to a create: the resource existed before this apply."""
    diags.add_error(
        f"{what} {wire_name} exists already",
        f"it was made outside this Terraform state; import it: terraform import <address> {import_id}",
    )


def delete_quietly(client: OrbitClient, path: str) -> None:
    """DELETE; already gone is fine."""
    try:
        client.call("DELETE", path)
    except ApiError as e:
        if e.status != 404:
            raise
