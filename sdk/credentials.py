"""Credentials for the SDK: the ``credentials`` hook of ``ClientInstance``.

Three kinds, each usable as ``Producer(..., credentials=c)`` / ``ClientInstance(credentials=c)``:

* ``ClientCredentials(client_id, client_secret, token_url)`` — OAuth2 client-credentials grant
  (RFC 6749 §4.4: form POST ``grant_type=client_credentials``, client id and secret by HTTP
  Basic auth, each form-urlencoded first as §2.3.1 asks). The token is kept until shortly before
  it expires (``refresh_margin_s``, at most half its lifetime), then refreshed in the background
  while requests go on with the current one; failures are retried with exponential backoff and
  jitter. An endpoint answering 400/401 (bad client id or secret) fails fast with
  ``AuthenticationError``.
* ``StaticToken(token)`` — a token obtained elsewhere.
* ``AccessKeyCredentials(access_key, secret_key)`` — RocketMQ ACL signing, exactly as stock
  clients do (``AccessKey`` + ``Signature`` = base64 HMAC-SHA1 over the sorted extFields values
  and the body; see ``data_plane.auth.signature``).

Any object with ``async def token() -> str`` is a ``TokenProvider``; ``ClientInstance`` wraps
one in ``ProviderCredentials``. A token travels as extFields ``Authorization: Bearer <jwt>``.

The hot path: ``ClientInstance`` calls ``ensure_fresh()`` before each request — a clock read and
a comparison while the token is fresh (it returns None); only when there is no usable token does
it return an awaitable to wait on. Then the hook (``__call__``) adds the fields.

Secrets and tokens never appear in ``repr``/``str`` or in log records.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import random
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol, runtime_checkable

import aiohttp
import orjson

from data_plane.auth.signature import ACCESS_KEY, ONS_CHANNEL, SECURITY_TOKEN, SIGNATURE, sign
from data_plane.remoting.command import RemotingCommand
from data_plane.tls import http_ssl
from sdk.errors import OrbitError

log = logging.getLogger(__name__)

AUTHORIZATION = "Authorization"


class AuthenticationError(OrbitError):
    """The token endpoint refused the client id or secret (HTTP 400/401): retrying will not help."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class TokenUnavailableError(OrbitError):
    """No token could be obtained (endpoint unreachable or failing) after every retry."""

    retriable = True


@runtime_checkable
class TokenProvider(Protocol):
    async def token(self) -> str: ...


def jwt_claims(token: str) -> dict[str, Any]:
    """A JWT's claims, read without verification: what it says about itself (when to refresh,
    which tenant it names), never a proof of anything. Empty when it is not a readable JWT."""
    try:
        payload = token.split(".")[1]
        claims = orjson.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except (IndexError, ValueError, orjson.JSONDecodeError):
        return {}
    return claims if isinstance(claims, dict) else {}


def _jwt_exp(token: str) -> float | None:
    """The ``exp`` claim of a JWT, read without verification (only to know when to refresh)."""
    exp = jwt_claims(token).get("exp")
    return float(exp) if isinstance(exp, int | float) and not isinstance(exp, bool) else None


class _BearerHook:
    """What every token credential shares: the current token and the ClientInstance hook."""

    def __init__(self) -> None:
        self._fields: dict[str, str] | None = None  # {"Authorization": "Bearer …"} of the current token

    def _set_token(self, token: str) -> None:
        self._fields = {AUTHORIZATION: f"Bearer {token}"}

    def __call__(self, cmd: RemotingCommand) -> Mapping[str, str] | None:
        return self._fields

    def ensure_fresh(self) -> Awaitable[None] | None:
        raise NotImplementedError

    def fresh_fields(self) -> Mapping[str, str] | None:
        """The fields a request carries now, when the token can go as it is (a refresh that is
        due starts in the background, as ``ensure_fresh`` starts it) — or None when a token must
        be fetched first. The same mapping object until the token changes: the SDK's send path
        lays its frames out with them (``ClientInstance.send_connection``) and re-encodes them
        only when it sees another object."""
        raise NotImplementedError

    def __str__(self) -> str:
        return repr(self)


class StaticToken(_BearerHook):
    """A fixed token (from a file, an environment variable, another login flow)."""

    def __init__(self, token: str) -> None:
        super().__init__()
        if not token or not isinstance(token, str):
            raise ValueError("StaticToken needs a non-empty token")
        self._token = token
        self._set_token(token)

    async def token(self) -> str:
        return self._token

    def ensure_fresh(self) -> Awaitable[None] | None:
        return None

    def fresh_fields(self) -> Mapping[str, str] | None:
        return self._fields

    def __repr__(self) -> str:
        return "StaticToken(<redacted>)"


class _Refreshing(_BearerHook):
    """A token that expires: fetched on first use, refreshed in the background from
    ``refresh_at`` on, awaited only when missing or expired (``usable_until``)."""

    def __init__(self, *, clock_s: Callable[[], float]) -> None:
        super().__init__()
        self.clock_s = clock_s
        self._token: str | None = None
        self._refresh_at = 0.0  # clock time from which a background refresh starts
        self._usable_until = 0.0  # clock time after which the token is not sent any more
        self._inflight: asyncio.Task[str] | None = None

    async def _fetch(self) -> tuple[str, float | None]:
        """A new token and its lifetime in seconds (None when unknown)."""
        raise NotImplementedError

    def _schedule(self, lifetime_s: float | None) -> None:
        raise NotImplementedError

    async def _obtain(self) -> str:
        token, lifetime_s = await self._fetch()
        self._token = token
        self._set_token(token)
        self._schedule(lifetime_s)
        return token

    def _start(self) -> asyncio.Task[str]:
        task = self._inflight
        if task is None or task.done():
            task = asyncio.get_running_loop().create_task(self._obtain(), name="orbit-token-refresh")
            task.add_done_callback(self._done)
            self._inflight = task
        return task

    def _done(self, task: asyncio.Task[str]) -> None:
        if self._inflight is task:
            self._inflight = None
        if not task.cancelled() and task.exception() is not None:  # retrieve it: no "never retrieved"
            log.warning("%r: token refresh failed: %s", self, type(task.exception()).__name__)

    async def token(self) -> str:
        now = self.clock_s()
        if self._token is not None and now < self._usable_until:
            if now >= self._refresh_at:
                self._start()
            return self._token
        return await asyncio.shield(self._start())

    def ensure_fresh(self) -> Awaitable[None] | None:
        now = self.clock_s()
        if now < self._refresh_at:
            return None  # the hot path
        if self._token is not None and now < self._usable_until:
            self._start()  # refresh in the background; this request goes with the current token
            return None
        return self._wait()

    def fresh_fields(self) -> Mapping[str, str] | None:
        now = self.clock_s()
        if now < self._refresh_at:
            return self._fields
        if self._token is not None and now < self._usable_until:
            self._start()
            return self._fields
        return None

    async def _wait(self) -> None:
        await self.token()

    async def aclose(self) -> None:
        task, self._inflight = self._inflight, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


class ClientCredentials(_Refreshing):
    """OAuth2 client credentials → short-lived JWTs from the control plane's token endpoint."""

    def __init__(
        self,
        client_id: str,
        client_secret: str,
        token_url: str,
        *,
        scope: str | None = None,
        refresh_margin_s: float = 60.0,
        request_timeout_s: float = 10.0,
        max_attempts: int = 5,
        backoff_initial_s: float = 0.2,
        backoff_max_s: float = 10.0,
        session: aiohttp.ClientSession | None = None,
        clock_s: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(clock_s=clock_s)
        if not client_id or not client_secret or not token_url:
            raise ValueError("ClientCredentials needs client_id, client_secret and token_url")
        self.client_id = client_id
        self._client_secret = client_secret
        self.token_url = token_url
        self.scope = scope
        self.refresh_margin_s = refresh_margin_s
        self.request_timeout_s = request_timeout_s
        self.max_attempts = max(1, max_attempts)
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self._session = session
        self._own_session = session is None
        self.fetches = 0

    def __repr__(self) -> str:
        return f"ClientCredentials(client_id={self.client_id!r}, token_url={self.token_url!r})"

    def _schedule(self, lifetime_s: float | None) -> None:
        now = self.clock_s()
        if lifetime_s is None or lifetime_s <= 0:
            lifetime_s = 300.0  # no expires_in and no readable exp: ask again in 5 minutes
        margin = min(self.refresh_margin_s, lifetime_s / 2)
        self._refresh_at = now + lifetime_s - margin
        # Stop sending it a little before it expires (clock skew, time in flight).
        self._usable_until = now + lifetime_s - min(5.0, margin / 2)

    def _basic_auth(self) -> str:
        q = urllib.parse.quote
        raw = f"{q(self.client_id, safe='')}:{q(self._client_secret, safe='')}".encode()
        return "Basic " + base64.b64encode(raw).decode("ascii")

    async def _fetch(self) -> tuple[str, float | None]:
        delay = self.backoff_initial_s
        last = ""
        for attempt in range(1, self.max_attempts + 1):
            try:
                return await self._request_token()
            except AuthenticationError:
                raise
            except (aiohttp.ClientError, TimeoutError, OSError, _RetryableResponse) as e:
                last = str(e) if isinstance(e, _RetryableResponse) else type(e).__name__
                log.info("%r: token request %d/%d failed: %s", self, attempt, self.max_attempts, last)
            if attempt < self.max_attempts:
                await asyncio.sleep(delay * (0.5 + random.random() / 2))
                delay = min(delay * 2, self.backoff_max_s)
        raise TokenUnavailableError(f"no token from {self.token_url} after {self.max_attempts} attempts (last: {last})")

    async def _request_token(self) -> tuple[str, float | None]:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=http_ssl()))
            self._own_session = True
        form = {"grant_type": "client_credentials"}
        if self.scope:
            form["scope"] = self.scope
        headers = {"Authorization": self._basic_auth(), "Accept": "application/json"}
        self.fetches += 1
        timeout = aiohttp.ClientTimeout(total=self.request_timeout_s)
        async with self._session.post(self.token_url, data=form, headers=headers, timeout=timeout) as resp:
            raw = await resp.read()
            status = resp.status
        if status in (400, 401, 403):
            raise AuthenticationError(
                f"token endpoint {self.token_url} refused client {self.client_id!r}: HTTP {status}{_oauth_error(raw)}",
                status=status,
            )
        if status != 200:
            raise _RetryableResponse(f"HTTP {status}{_oauth_error(raw)}")
        try:
            doc = orjson.loads(raw)
            token = doc["access_token"]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            raise _RetryableResponse("the answer has no access_token") from None
        if not isinstance(token, str) or not token:
            raise _RetryableResponse("access_token is not a string")
        token_type = str(doc.get("token_type", "Bearer"))
        if token_type.lower() != "bearer":
            raise AuthenticationError(f"token endpoint {self.token_url} issued a {token_type!r} token, not Bearer")
        expires_in = doc.get("expires_in")
        lifetime: float | None = None
        if isinstance(expires_in, int | float) and not isinstance(expires_in, bool):
            lifetime = float(expires_in)
        else:
            exp = _jwt_exp(token)
            if exp is not None:
                lifetime = exp - time.time()
        return token, lifetime

    async def aclose(self) -> None:
        await super().aclose()
        if self._own_session and self._session is not None:
            await self._session.close()
            self._session = None


class _RetryableResponse(Exception):
    """A token endpoint answer worth retrying (5xx, 429, garbage)."""


def _oauth_error(raw: bytes) -> str:
    """`` (invalid_client: …)`` from an RFC 6749 error body, else nothing."""
    try:
        doc: Any = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return ""
    if not isinstance(doc, dict) or not isinstance(doc.get("error"), str):
        return ""
    desc = doc.get("error_description")
    text = doc["error"] + (f": {desc}" if isinstance(desc, str) else "")
    return f" ({text[:200]})"


class ProviderCredentials(_Refreshing):
    """Any ``TokenProvider`` as the ClientInstance hook: asks the provider when there is no token,
    and again from shortly before the token's ``exp`` (read from the JWT, unverified) — or every
    ``refresh_interval_s`` when the token says no expiry."""

    def __init__(
        self,
        provider: TokenProvider,
        *,
        refresh_margin_s: float = 60.0,
        refresh_interval_s: float = 300.0,
        clock_s: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(clock_s=clock_s)
        self.provider = provider
        self.refresh_margin_s = refresh_margin_s
        self.refresh_interval_s = refresh_interval_s

    def __repr__(self) -> str:
        return f"ProviderCredentials({type(self.provider).__name__})"

    async def _fetch(self) -> tuple[str, float | None]:
        token = await self.provider.token()
        if not isinstance(token, str) or not token:
            raise AuthenticationError(f"{type(self.provider).__name__}.token() returned no token")
        exp = _jwt_exp(token)
        return token, None if exp is None else exp - time.time()

    def _schedule(self, lifetime_s: float | None) -> None:
        now = self.clock_s()
        if lifetime_s is None:
            self._refresh_at = now + self.refresh_interval_s
            self._usable_until = float("inf")
            return
        margin = min(self.refresh_margin_s, max(lifetime_s, 0) / 2)
        self._refresh_at = now + lifetime_s - margin
        self._usable_until = now + lifetime_s - min(5.0, margin / 2)


class AccessKeyCredentials:
    """RocketMQ ACL request signing (AccessKey + Signature), as stock RocketMQ clients do it."""

    __slots__ = ("_secret_key", "access_key", "ons_channel", "security_token")

    def __init__(
        self, access_key: str, secret_key: str, *, security_token: str | None = None, ons_channel: str | None = None
    ) -> None:
        if not access_key or not secret_key:
            raise ValueError("AccessKeyCredentials needs access_key and secret_key")
        self.access_key = access_key
        self._secret_key = secret_key
        self.security_token = security_token
        self.ons_channel = ons_channel

    def __call__(self, cmd: RemotingCommand) -> Mapping[str, str] | None:
        fields = dict(cmd.ext_fields) if cmd.ext_fields else {}
        fields[ACCESS_KEY] = self.access_key
        extra = {ACCESS_KEY: self.access_key}
        if self.security_token is not None:
            fields[SECURITY_TOKEN] = extra[SECURITY_TOKEN] = self.security_token
        if self.ons_channel is not None:
            fields[ONS_CHANNEL] = extra[ONS_CHANNEL] = self.ons_channel
        extra[SIGNATURE] = sign(fields, cmd.body_bytes(), self._secret_key)
        return extra

    def ensure_fresh(self) -> Awaitable[None] | None:
        return None

    def __repr__(self) -> str:
        return f"AccessKeyCredentials(access_key={self.access_key!r})"

    def __str__(self) -> str:
        return repr(self)


def as_hook(credentials: Any) -> Any:
    """The ClientInstance hook for ``credentials``: callables as they are, a bare
    ``TokenProvider`` wrapped in ``ProviderCredentials``."""
    if credentials is None or callable(credentials):
        return credentials
    if isinstance(credentials, TokenProvider):
        return ProviderCredentials(credentials)
    raise TypeError(f"credentials must be a hook or a TokenProvider, not {type(credentials).__name__}")
