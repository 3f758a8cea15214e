"""The provider itself: its configuration (control-plane URL, client id and secret, default
tenant), a lazily made API client, and the resource and data source types it serves."""

from __future__ import annotations

import os
import threading
from typing import Any

from tf import types
from tf.iface import Config, DataSource, Provider, Resource
from tf.schema import Attribute, Schema
from tf.types import Unknown
from tf.utils import Diagnostics

from orbit_provider import ADDRESS
from orbit_provider.client import OrbitClient

ENV = {
    "endpoint": "ORBIT_CONTROL_PLANE_URL",
    "client_id": "ORBIT_CLIENT_ID",
    "client_secret": "ORBIT_CLIENT_SECRET",
    "tenant": "ORBIT_TENANT",
}
DEFAULT_WAIT_S = 120.0


class ConfigurationError(Exception):
    """The provider cannot reach the API as configured; the message says what is missing."""


def known(value: Any) -> bool:
    return value is not None and value is not Unknown


class OrbitProvider(Provider):  # type: ignore[misc]  # tf has no type information
    def __init__(self) -> None:
        self._settings: dict[str, Any] = {}
        self._client: OrbitClient | None = None
        self._lock = threading.Lock()

    # --- identity -------------------------------------------------------------------------------
    def get_model_prefix(self) -> str:
        return "orbit_"

    def full_name(self) -> str:
        return ADDRESS

    def get_provider_schema(self, diags: Diagnostics) -> Schema:
        return Schema(
            description="Orbit's control plane: tenants, topics, consumer groups, credentials, ACLs and quotas.",
            attributes=[
                Attribute(
                    "endpoint",
                    types.String(),
                    optional=True,
                    description="The control plane's URL, e.g. https://orbit.example.com "
                    "(default: ORBIT_CONTROL_PLANE_URL).",
                ),
                Attribute(
                    "client_id",
                    types.String(),
                    optional=True,
                    description="Access key of the credential Terraform acts as (default: ORBIT_CLIENT_ID). "
                    "An operator credential manages tenants and quotas; a tenant credential its own tenant.",
                ),
                Attribute(
                    "client_secret",
                    types.String(),
                    optional=True,
                    sensitive=True,
                    description="That credential's secret (default: ORBIT_CLIENT_SECRET). Never logged.",
                ),
                Attribute(
                    "tenant",
                    types.String(),
                    optional=True,
                    description="Tenant of resources that name none (default: ORBIT_TENANT, else the "
                    "tenant of a tenant credential).",
                ),
                Attribute(
                    "wait_for_active_s",
                    types.Number(),
                    optional=True,
                    description="How long creating or growing a topic waits for it to be active on the "
                    f"brokers (default {DEFAULT_WAIT_S:.0f}; 0: do not wait).",
                ),
            ],
        )

    # --- configuration --------------------------------------------------------------------------
    def validate_config(self, diags: Diagnostics, config: Config) -> None:
        endpoint = config.get("endpoint")
        if known(endpoint) and not str(endpoint).startswith(("http://", "https://")):
            diags.add_error("Invalid endpoint", f"endpoint {endpoint!r} is not an http(s) URL", path=["endpoint"])
        wait = config.get("wait_for_active_s")
        if known(wait) and wait < 0:
            diags.add_error("Invalid wait_for_active_s", "must be >= 0", path=["wait_for_active_s"])

    def configure_provider(self, diags: Diagnostics, config: Config) -> None:
        settings: dict[str, Any] = {}
        for key, env in ENV.items():
            value = config.get(key)
            if value is Unknown:
                settings[key] = Unknown  # from a resource not made yet: an error only if used
            elif value:
                settings[key] = str(value)
            else:
                settings[key] = os.environ.get(env, "")
        wait = config.get("wait_for_active_s")
        settings["wait_for_active_s"] = float(wait) if known(wait) else DEFAULT_WAIT_S
        with self._lock:
            self._settings = settings
            self._client = None

    @property
    def wait_for_active_s(self) -> float:
        return float(self._settings.get("wait_for_active_s", DEFAULT_WAIT_S))

    def client(self) -> OrbitClient:
        with self._lock:
            if self._client is None:
                missing = [
                    f"{k} (or {ENV[k]})"
                    for k in ("endpoint", "client_id", "client_secret")
                    if not self._settings.get(k)
                ]
                if missing:
                    raise ConfigurationError("the provider needs " + ", ".join(missing))
                unknown = [k for k in ("endpoint", "client_id", "client_secret") if self._settings[k] is Unknown]
                if unknown:
                    raise ConfigurationError(
                        "the provider's " + ", ".join(unknown) + " are not known yet (they come from resources "
                        "not made yet); apply those first, e.g. with -target"
                    )
                self._client = OrbitClient(
                    self._settings["endpoint"], self._settings["client_id"], self._settings["client_secret"]
                )
            return self._client

    def tenant(self, configured: Any) -> str:
        """The tenant a resource means: its own ``tenant``, else the provider's, else the credential's."""
        if known(configured) and configured:
            return str(configured)
        default = self._settings.get("tenant")
        if default and default is not Unknown:
            return str(default)
        tenant = self.client().tenant
        if tenant is None:
            raise ConfigurationError(
                "no tenant: set the resource's tenant, the provider's tenant (ORBIT_TENANT), or use a tenant credential"
            )
        return tenant

    # --- types ------------------------------------------------------------------------------------
    def get_resources(self) -> list[type[Resource]]:
        from orbit_provider import resources

        return list(resources.RESOURCES)

    def get_data_sources(self) -> list[type[DataSource]]:
        from orbit_provider import data_sources

        return list(data_sources.DATA_SOURCES)
