"""Data sources: orbit_topic (a topic as the control plane holds it) and orbit_endpoints (where
clients connect: the name servers, the token endpoint)."""

from __future__ import annotations

from typing import Any, ClassVar

from tf import types
from tf.iface import Config, DataSource, ReadDataContext, State
from tf.schema import Schema

from orbit_provider.client import ApiError, quote
from orbit_provider.provider import ConfigurationError, OrbitProvider
from orbit_provider.resources import Topic, attr


class OrbitDataSource(DataSource):  # type: ignore[misc]  # tf has no type information
    name: ClassVar[str]

    def __init__(self, provider: OrbitProvider) -> None:
        self.provider = provider

    @classmethod
    def get_name(cls) -> str:
        return cls.name

    def read(self, ctx: ReadDataContext, config: Config) -> State | None:
        try:
            return self._read(config)
        except ApiError as e:
            ctx.diagnostics.add_error(e.summary, e.detail)
        except ConfigurationError as e:
            ctx.diagnostics.add_error("Orbit provider configuration", str(e))
        return None

    def _read(self, config: Config) -> State:
        raise NotImplementedError


class TopicData(OrbitDataSource):
    name = "topic"

    @classmethod
    def get_schema(cls) -> Schema:
        computed = [
            attr(a.name, a.type, a.description or "", computed=True)
            for a in Topic.get_schema().attributes
            if a.name not in ("tenant", "name")
        ]
        return Schema(
            description="A topic as the control plane holds it.",
            attributes=[
                attr("tenant", types.String(), "The tenant (default: the provider's).", optional=True, computed=True),
                attr("name", types.String(), "The topic name.", required=True),
                *computed,
            ],
        )

    def _read(self, config: Config) -> State:
        tenant = self.provider.tenant(config.get("tenant"))
        topic = self.provider.client().get(f"/v1/tenants/{quote(tenant)}/topics/{quote(config['name'])}")
        return Topic._state(topic)


class EndpointsData(OrbitDataSource):
    name = "endpoints"

    @classmethod
    def get_schema(cls) -> Schema:
        return Schema(
            description="Where clients connect.",
            attributes=[
                attr("control_plane_url", types.String(), "The control plane's URL.", computed=True),
                attr("token_url", types.String(), "The OAuth2 token endpoint (client credentials).", computed=True),
                attr("jwks_url", types.String(), "The token keys (JWKS).", computed=True),
                attr(
                    "namesrv_addrs",
                    types.List(types.String()),
                    "Name servers (host:port) of the active broker groups.",
                    computed=True,
                ),
                attr(
                    "namesrv_addr",
                    types.String(),
                    "The same, ';'-separated (RocketMQ clients' namesrvAddr).",
                    computed=True,
                ),
            ],
        )

    def _read(self, config: Config) -> State:
        client = self.provider.client()
        answer: dict[str, Any] = client.get("/v1/endpoints")
        addrs = list(answer["namesrv_addrs"])
        return {
            "control_plane_url": client.endpoint,
            "token_url": client.endpoint + "/oauth/token",
            "jwks_url": client.endpoint + "/.well-known/jwks.json",
            "namesrv_addrs": addrs,
            "namesrv_addr": ";".join(addrs),
        }


DATA_SOURCES: tuple[type[OrbitDataSource], ...] = (TopicData, EndpointsData)
