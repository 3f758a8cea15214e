"""AuthConfig: the broker's (or name server's) auth options, one frozen object read at start.

Keys follow BrokerConfig's style (units in the names); a broker TOML file can hold them in an
``[auth]`` table and pass them as ``AuthConfig(**table)``. ``for_store_dir`` fills the file paths
under ``<store_dir>/config/auth/``::

    [auth]
    enabled = true
    jwks_url = "http://control-plane:8080/.well-known/jwks.json"
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class AuthConfig:
    enabled: bool = False
    # JWTs: the control plane's JWKS endpoint, and where the last key set is kept across restarts.
    jwks_url: str = ""
    jwks_cache_path: str = ""
    jwks_refresh_interval_s: float = 300.0
    jwks_unknown_kid_min_interval_s: float = 30.0
    jwks_fetch_timeout_s: float = 10.0
    issuer: str = "orbit"
    audience: str = "orbit"
    token_leeway_s: float = 30.0
    token_cache_max: int = 10_000
    # Access keys (RocketMQ ACL signatures): the encrypted snapshot and its 0600 key file.
    credential_store_path: str = ""
    credential_key_path: str = ""
    # Per-(principal, resource, action) decisions kept on the hot path.
    decision_cache_max: int = 65_536
    # VIEW_MESSAGE_BY_ID / END_TRANSACTION name no topic: when True, tenants pass the first check
    # and the broker must call Authorizer.authorize_stored_topic on the message's topic.
    deferred_checks: bool = False

    @classmethod
    def for_store_dir(cls, store_dir: str, **values: Any) -> AuthConfig:
        base = os.path.join(store_dir, "config", "auth")
        values.setdefault("jwks_cache_path", os.path.join(base, "jwks.json"))
        values.setdefault("credential_store_path", os.path.join(base, "credentials.bin"))
        values.setdefault("credential_key_path", os.path.join(base, "credentials.key"))
        return cls(**values)

    def validate(self) -> AuthConfig:
        problems = []
        if self.enabled and not self.jwks_url and not self.credential_store_path:
            problems.append("auth is enabled but neither jwks_url nor credential_store_path is set")
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, int | float) and not isinstance(v, bool) and v < 0:
                problems.append(f"{f.name} must be >= 0")
        if problems:
            raise ValueError("; ".join(problems))
        return self
