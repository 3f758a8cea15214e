"""Credentials for the Orbit Spark data source, built from options or the environment.

Secrets live only inside ``Secret`` (its ``repr``/``str`` say ``<redacted>``), so a reader or
writer object, an options object or an error message never shows them. The objects here are
plain picklable data: Spark ships them to executors, where ``sdk_credentials()`` builds the
SDK's credentials hook inside each task (on the task's own event loop).

Where credentials come from, first match wins:

1. options: ``clientId`` + ``clientSecret`` + ``tokenUrl`` (OAuth2 client credentials), or
   ``accessKey`` + ``secretKey`` (RocketMQ ACL signing), or ``token`` (a static bearer token),
   or ``tokenProvider`` = ``"module:callable"`` (called on each executor, returns an object with
   ``async def token() -> str``);
2. the environment of the process that plans the query: ``ORBIT_CLIENT_ID`` /
   ``ORBIT_CLIENT_SECRET`` / ``ORBIT_TOKEN_URL``, ``ORBIT_ACCESS_KEY`` / ``ORBIT_SECRET_KEY``,
   ``ORBIT_TOKEN``;
3. none: an open cluster (no authentication).
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from data_plane.tls import client_context
from sdk.client_instance import Credentials
from sdk.credentials import AccessKeyCredentials, ClientCredentials, StaticToken, TokenProvider
from spark_integration.errors import OrbitSparkError

ENV_CLIENT_ID = "ORBIT_CLIENT_ID"
ENV_CLIENT_SECRET = "ORBIT_CLIENT_SECRET"
ENV_TOKEN_URL = "ORBIT_TOKEN_URL"
ENV_ACCESS_KEY = "ORBIT_ACCESS_KEY"
ENV_SECRET_KEY = "ORBIT_SECRET_KEY"
ENV_TOKEN = "ORBIT_TOKEN"

# Option names (lower case: Spark hands options over case-insensitively) that hold secrets.
SECRET_OPTIONS = frozenset({"clientsecret", "secretkey", "token"})


class Secret:
    """A string that never shows itself: ``repr``/``str`` are ``<redacted>``; ``reveal()`` gives it."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "<redacted>"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)

    def __getstate__(self) -> str:
        return self._value

    def __setstate__(self, state: str) -> None:
        self._value = state


@dataclass(frozen=True)
class CredentialSpec:
    """What to authenticate with; picklable, secrets redacted in ``repr``."""

    kind: str  # "none" | "client" | "access_key" | "token" | "provider"
    client_id: str | None = None
    token_url: str | None = None
    access_key: str | None = None
    provider: str | None = None  # "module:callable"
    secret: Secret | None = None  # client secret, secret key or token
    # TLS to name servers and brokers: "" and False = the environment decides (ORBIT_TLS_CA /
    # ORBIT_TLS, as in the SDK); a CA file, or True for the system's trust store (options tlsCaFile, tls).
    tls_ca_file: str = ""
    tls: bool = False

    def tls_context(self) -> ssl.SSLContext | None:
        """The SDK's ``tls=`` (made on the executor: an SSLContext does not pickle)."""
        if self.tls_ca_file:
            return client_context(ca_file=self.tls_ca_file)
        if self.tls:
            return client_context()
        return None

    def describe(self) -> str:
        """Who we are, for error messages (never the secret)."""
        if self.kind == "client":
            return f"client id {self.client_id!r} (token endpoint {self.token_url})"
        if self.kind == "access_key":
            return f"access key {self.access_key!r}"
        if self.kind == "token":
            return "the static token"
        if self.kind == "provider":
            return f"the token provider {self.provider}"
        return "no credentials"

    def sdk_credentials(self) -> Credentials | TokenProvider | None:
        """The SDK credentials; build them on the event loop that will use them (token
        credentials keep an HTTP session and a refresh task there)."""
        if self.kind == "none":
            return None
        assert self.secret is not None or self.kind == "provider"
        if self.kind == "client":
            assert self.client_id is not None
            assert self.token_url is not None
            assert self.secret is not None
            return ClientCredentials(self.client_id, self.secret.reveal(), self.token_url)
        if self.kind == "access_key":
            assert self.access_key is not None
            assert self.secret is not None
            return AccessKeyCredentials(self.access_key, self.secret.reveal())
        if self.kind == "token":
            assert self.secret is not None
            return StaticToken(self.secret.reveal())
        assert self.provider is not None
        return _load_provider(self.provider)


async def close_credentials(creds: object) -> None:
    """Close what ``sdk_credentials`` built (ClientCredentials hold an HTTP session)."""
    aclose = getattr(creds, "aclose", None)
    if aclose is not None:
        await aclose()


def _load_provider(spec: str) -> TokenProvider:
    module, _, attr = spec.partition(":")
    if not module or not attr:
        raise OrbitSparkError(f"tokenProvider must be 'module:callable', got {spec!r}")
    try:
        factory: Any = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise OrbitSparkError(f"tokenProvider {spec!r} cannot be loaded: {e}") from None
    provider = factory()
    if not isinstance(provider, TokenProvider):
        raise OrbitSparkError(f"tokenProvider {spec!r} did not return an object with 'async def token()'")
    return provider


def _pick(options: Mapping[str, str], env: Mapping[str, str], option: str, var: str) -> str | None:
    value = options.get(option.lower())
    if value is None or value == "":
        value = env.get(var) or None
    return value


def credentials_from(options: Mapping[str, str], env: Mapping[str, str] | None = None) -> CredentialSpec:
    """The credentials that ``options`` (keys in lower case) or ``env`` name, with the TLS options
    (``tls``: true | false, ``tlsCaFile``); clear errors when they are incomplete. Options win over
    the environment, kind by kind."""
    spec = _credentials(options, env)
    tls = options.get("tls", "").strip().lower()
    if tls not in ("", "true", "false"):
        raise OrbitSparkError(f"tls must be true or false, got {options.get('tls')!r}")
    ca_file = options.get("tlscafile", "")
    if ca_file and not os.path.isfile(ca_file):
        raise OrbitSparkError(f"tlsCaFile {ca_file!r} is not a readable file")
    return dataclasses.replace(spec, tls_ca_file=ca_file, tls=tls == "true")


def _credentials(options: Mapping[str, str], env: Mapping[str, str] | None) -> CredentialSpec:
    env = os.environ if env is None else env
    opt = {k: v for k, v in options.items() if v != ""}
    if any(k in opt for k in ("clientid", "clientsecret", "tokenurl")):
        src: Mapping[str, str] = {}
    else:
        src = env
    client_id = _pick(opt, src, "clientId", ENV_CLIENT_ID)
    client_secret = _pick(opt, src, "clientSecret", ENV_CLIENT_SECRET)
    token_url = _pick(opt, src, "tokenUrl", ENV_TOKEN_URL)
    if client_id or client_secret:
        missing = [
            n for n, v in (("clientId", client_id), ("clientSecret", client_secret), ("tokenUrl", token_url)) if not v
        ]
        if missing:
            raise OrbitSparkError(
                "OAuth client credentials need clientId, clientSecret and tokenUrl "
                f"(options or {ENV_CLIENT_ID}/{ENV_CLIENT_SECRET}/{ENV_TOKEN_URL}); missing: {', '.join(missing)}"
            )
        assert client_id
        assert client_secret
        assert token_url
        if not token_url.startswith(("http://", "https://")):
            raise OrbitSparkError(f"tokenUrl must be an http(s) URL, got {token_url!r}")
        return CredentialSpec("client", client_id=client_id, token_url=token_url, secret=Secret(client_secret))
    src = {} if any(k in opt for k in ("accesskey", "secretkey")) else env
    access_key = _pick(opt, src, "accessKey", ENV_ACCESS_KEY)
    secret_key = _pick(opt, src, "secretKey", ENV_SECRET_KEY)
    if access_key or secret_key:
        if not (access_key and secret_key):
            raise OrbitSparkError(
                "RocketMQ ACL credentials need both accessKey and secretKey "
                f"(options or {ENV_ACCESS_KEY}/{ENV_SECRET_KEY})"
            )
        return CredentialSpec("access_key", access_key=access_key, secret=Secret(secret_key))
    provider = opt.get("tokenprovider")
    if provider:
        if ":" not in provider:
            raise OrbitSparkError(f"tokenProvider must be 'module:callable', got {provider!r}")
        return CredentialSpec("provider", provider=provider)
    token = opt.get("token") or env.get(ENV_TOKEN)
    if token:
        return CredentialSpec("token", secret=Secret(token))
    return CredentialSpec("none")


def options_from_conf(conf: Mapping[str, str]) -> dict[str, str]:
    """Driver-side helper: the ``spark.orbit.*`` entries of a Spark conf (e.g.
    ``dict(spark.sparkContext.getConf().getAll())``) as data source options
    (``spark.orbit.clientSecret`` → ``clientSecret``). Spark redacts conf keys matching
    ``spark.redaction.regex`` (``secret|password|token`` by default) in its UI and logs."""
    prefix = "spark.orbit."
    return {k[len(prefix) :]: v for k, v in conf.items() if k.startswith(prefix)}
