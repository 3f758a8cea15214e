"""Authorizer: who sent a request (``authenticate``) and whether they may (``authorize``).

    check(cmd) ─▶ authenticate ─┬─ "Authorization: Bearer <jwt>" ─▶ TokenVerifier (JWKS cache)
                                ├─ AccessKey + Signature ─────────▶ CredentialStore + HMAC-SHA1
                                └─ neither ─▶ refused ("no credentials")
               ─▶ authorize ─▶ request_access.ACCESS[code](cmd) ─▶ needs ─▶ decision cache ─▶ grants

Both steps run on the broker's event loop for every request, without I/O: a cached token costs
one dict lookup, a decision one more per resource (bounded dict keyed by principal, kind, wire
name, action). The one exception is a token whose ``kid`` is unknown: ``check`` then returns an
awaitable that refreshes the JWKS (rate-limited) and verifies again — the broker's processors
already answer ``RemotingCommand | Awaitable[RemotingCommand]``.

Every refusal is a ``Denial`` with ResponseCode.NO_PERMISSION (16) and a remark that says why
("token expired", "signature does not match", "unknown access key", "… may not publish topic
'orders' …"). Operators and brokers are allowed everything once authenticated; tenants only
their own namespace, within their grants. When ``enabled`` is False every request passes
(``check`` returns ``UNCHECKED``).

Wiring on a broker (see docs/auth.md)::

    auth = Authorizer.from_config(AuthConfig.for_store_dir(store_dir, enabled=True, jwks_url=url))
    await auth.start()                       # loads credentials.bin, jwks.json, fetches the JWKS
    result = auth.check(cmd)                 # Principal | Denial | Awaitable[Principal | Denial]
    await auth.credentials.apply(snapshot, version)   # from the control plane's reconciler
    await auth.stop()
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Final, NamedTuple

from data_plane.auth import signature, v2_signature
from data_plane.auth.config import AuthConfig
from data_plane.auth.credential_store import CredentialStore
from data_plane.auth.errors import AuthError, UnknownKeyIdError
from data_plane.auth.jwks import Fetcher, JwksCache
from data_plane.auth.jwt_verifier import TokenVerifier
from data_plane.auth.principal import Principal
from data_plane.auth.request_access import (
    NAMESPACE,
    OPEN_SYSTEM_TOPICS,
    PRODUCER,
    PUBLISH,
    SUBSCRIBE,
    BodyError,
    access_of,
)
from data_plane.remoting.codes import ResponseCode
from data_plane.remoting.command import RemotingCommand
from data_plane.tenancy.namespace import parse_wire_name

log = logging.getLogger(__name__)

AUTHORIZATION: Final = "Authorization"
BEARER: Final = "Bearer "
CLIENT_INNER_PRODUCER_GROUP: Final = "CLIENT_INNER_PRODUCER"

UNCHECKED: Final = Principal("unchecked", "*", "operator", (), "disabled")


class Denial(NamedTuple):
    """A refused request: the response code and the remark the client reads."""

    code: int
    remark: str

    def response(self, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.response(self.code, self.remark)


def _deny(remark: str) -> Denial:
    return Denial(ResponseCode.NO_PERMISSION, remark)


_MISS: Final = Denial(-1, "")


class Authorizer:
    def __init__(
        self,
        *,
        enabled: bool = True,
        verifier: TokenVerifier | None = None,
        credentials: CredentialStore | None = None,
        jwks: JwksCache | None = None,
        deferred_checks: bool = False,
        decision_cache_max: int = 65_536,
    ) -> None:
        self.enabled = enabled
        self.verifier = verifier
        self.credentials = credentials
        self.jwks = jwks
        self.deferred_checks = deferred_checks
        self.decision_cache_max = decision_cache_max
        self._decisions: dict[tuple[Principal, str, str, str], Denial | None] = {}
        self.denied = 0

    @classmethod
    def from_config(
        cls,
        config: AuthConfig,
        *,
        jwks_fetcher: Fetcher | None = None,
        clock_s: Callable[[], float] = time.time,
    ) -> Authorizer:
        """The authorizer an ``AuthConfig`` describes: a JWKS cache and token verifier when
        ``jwks_url`` (or ``jwks_fetcher``) is given, a credential store when
        ``credential_store_path`` is. Call ``start()`` on the event loop before serving."""
        jwks = verifier = None
        if config.jwks_url or jwks_fetcher is not None:
            jwks = JwksCache(
                url=None if jwks_fetcher is not None else config.jwks_url,
                fetcher=jwks_fetcher,
                cache_path=config.jwks_cache_path or None,
                refresh_interval_s=config.jwks_refresh_interval_s,
                unknown_kid_min_interval_s=config.jwks_unknown_kid_min_interval_s,
                fetch_timeout_s=config.jwks_fetch_timeout_s,
            )
            verifier = TokenVerifier(
                jwks,
                issuer=config.issuer,
                audience=config.audience,
                leeway_s=config.token_leeway_s,
                cache_max=config.token_cache_max,
                clock_s=clock_s,
            )
        store = None
        if config.credential_store_path:
            store = CredentialStore(config.credential_store_path, key_path=config.credential_key_path or None)
        return cls(
            enabled=config.enabled,
            verifier=verifier,
            credentials=store,
            jwks=jwks,
            deferred_checks=config.deferred_checks,
            decision_cache_max=config.decision_cache_max,
        )

    async def start(self) -> None:
        if self.credentials is not None:
            await asyncio.to_thread(self.credentials.load)
        if self.jwks is not None:
            await self.jwks.start()

    async def stop(self) -> None:
        if self.jwks is not None:
            await self.jwks.stop()

    # --- authentication ------------------------------------------------------------------------
    def authenticate(self, cmd: RemotingCommand) -> Principal:
        """The request's principal; raises AuthError (UnknownKeyIdError for a token whose kid
        the JWKS cache does not hold yet)."""
        ext = cmd.ext_fields
        if ext:
            bearer = ext.get(AUTHORIZATION)
            if bearer is not None:
                return self._bearer(bearer)
            access_key = ext.get(signature.ACCESS_KEY)
            if access_key is not None:
                return self._signed(cmd, ext, access_key)
        raise AuthError("no credentials: send a token (Authorization: Bearer) or an AccessKey and Signature")

    def authenticate_headers(self, authorization: str, date_time: str, *, max_skew_s: float) -> Principal:
        """The principal of a gRPC call (the RocketMQ 5 clients): a Bearer token, or an
        ``MQv2-HMAC-SHA1`` signature of ``date_time`` checked against the access key's secret
        exactly as an ACL signature is. Raises AuthError (UnknownKeyIdError as authenticate)."""
        if authorization.startswith(BEARER):
            return self._bearer(authorization)
        if not authorization:
            raise AuthError("no credentials: send a token (authorization: Bearer) or an MQv2-HMAC-SHA1 signature")
        signed = v2_signature.parse(authorization)
        cred = self.credentials.lookup(signed.access_key) if self.credentials is not None else None
        if self.credentials is None:
            raise AuthError("access keys are not accepted by this server")
        if cred is None:
            raise AuthError("unknown access key")
        if not cred.active:
            raise AuthError("access key revoked")
        v2_signature.verify(signed, cred.secret, date_time, max_skew_s=max_skew_s)
        return cred.principal

    def _bearer(self, value: str) -> Principal:
        if not value.startswith(BEARER):
            raise AuthError("the Authorization field is not 'Bearer <token>'")
        if self.verifier is None:
            raise AuthError("tokens are not accepted by this server")
        principal = self.verifier.verify(value[len(BEARER) :].strip())
        # A token outlives its credential's revocation (it verifies until it expires): refuse the
        # tokens of an access key the control plane's last snapshot says is revoked. Subjects the
        # store does not know (the control plane's own, other brokers' tenants) are not affected.
        store = self.credentials
        if store is not None:
            cred = store.lookup(principal.subject)
            if cred is not None and not cred.active:
                raise AuthError("the token's credential is revoked")
        return principal

    def _signed(self, cmd: RemotingCommand, ext: dict[str, str], access_key: str) -> Principal:
        if self.credentials is None:
            raise AuthError("access keys are not accepted by this server")
        cred = self.credentials.lookup(access_key)
        if cred is None:
            raise AuthError("unknown access key")
        if not cred.active:
            raise AuthError("access key revoked")
        if not ext.get(signature.SIGNATURE):
            raise AuthError("the request has an AccessKey but no Signature")
        if not signature.verify(ext, cmd.body_bytes(), cred.secret, version=cmd.version):
            raise AuthError("signature does not match")
        return cred.principal

    # --- authorization ------------------------------------------------------------------------
    def authorize(self, principal: Principal, cmd: RemotingCommand) -> Denial | None:
        """None when ``principal`` may make this request, else why not."""
        if not self.enabled or principal.role != "tenant":
            return None
        try:
            access = access_of(cmd)
        except BodyError as e:
            return _deny(f"cannot authorize request code {cmd.code}: {e}")
        if access.privileged:
            return _deny(f"request code {cmd.code} is for operators only, not a tenant credential")
        if access.deferred is not None and not self.deferred_checks:
            return _deny(f"request code {cmd.code} names no topic and is not open to tenants here")
        for need in access.needs:
            d = self.check_resource(principal, need.kind, need.wire, need.action)
            if d is not None:
                return d
        return None

    def check_resource(self, principal: Principal, kind: str, wire: str, action: str) -> Denial | None:
        """Whether ``principal`` may do ``action`` on the resource named ``wire`` (cached)."""
        if principal.role != "tenant":
            return None
        key = (principal, kind, wire, action)
        cache = self._decisions
        d = cache.get(key, _MISS)
        if d is not _MISS:
            return d
        d = _decide(principal, kind, wire, action)
        if len(cache) >= self.decision_cache_max:
            del cache[next(iter(cache))]
        cache[key] = d
        return d

    def authorize_stored_topic(self, principal: Principal, topic: str, action: str) -> Denial | None:
        """For the deferred codes (VIEW_MESSAGE_BY_ID: subscribe, END_TRANSACTION: publish):
        the broker calls this with the stored message's topic before answering."""
        if not self.enabled:
            return None
        return self.check_resource(principal, "topic", topic, action)

    def filter_names(self, principal: Principal, kind: str, wires: Iterable[str], action: str) -> list[str]:
        """The names of a listing ``principal`` may see (for a broker that filters listings
        instead of keeping them operator-only)."""
        return [w for w in wires if self.check_resource(principal, kind, w, action) is None]

    # --- both --------------------------------------------------------------------------------------
    def check(self, cmd: RemotingCommand) -> Principal | Denial | Awaitable[Principal | Denial]:
        """Authenticate then authorize ``cmd``: its principal, or a Denial to answer with; an
        awaitable of either only when a token's kid is unknown and a JWKS refresh may bring it."""
        if not self.enabled:
            return UNCHECKED
        try:
            principal = self.authenticate(cmd)
        except UnknownKeyIdError as e:
            if self.jwks is not None and self.jwks.unknown_kid_refresh_allowed():
                return self._check_after_refresh(cmd, e.kid)
            return self._refuse(e)
        except AuthError as e:
            return self._refuse(e)
        return self._authorize_counted(principal, cmd)

    async def _check_after_refresh(self, cmd: RemotingCommand, kid: str) -> Principal | Denial:
        assert self.jwks is not None
        await self.jwks.refresh_for_unknown_kid(kid)
        try:
            principal = self.authenticate(cmd)
        except AuthError as e:
            return self._refuse(e)
        return self._authorize_counted(principal, cmd)

    def _refuse(self, e: AuthError) -> Denial:
        """The Denial for a request that failed authentication, counted in ``denied``."""
        self.denied += 1
        return _deny(e.remark)

    def _authorize_counted(self, principal: Principal, cmd: RemotingCommand) -> Principal | Denial:
        """``principal`` when it may make ``cmd``, else the Denial, counted in ``denied``."""
        d = self.authorize(principal, cmd)
        if d is not None:
            self.denied += 1
            return d
        return principal


def _decide(p: Principal, kind: str, wire: str, action: str) -> Denial | None:
    special, tenant, name = parse_wire_name(wire)
    if tenant is None:
        if action == NAMESPACE and kind == "topic" and wire in OPEN_SYSTEM_TOPICS:
            return None  # route lookups of the default topic (auto-creation through a send)
        if action == PRODUCER:
            return None  # unprefixed producer groups (CLIENT_INNER_PRODUCER): they grant nothing
        shown = repr(wire) if wire else "(none given)"
        return _deny(f"{kind} {shown} is in no tenant's namespace: only operators may use it")
    if tenant != p.tenant:
        return _deny(f"{kind} {wire!r} is in tenant {tenant!r}'s namespace, not {p.tenant!r}'s")
    if action in (NAMESPACE, PRODUCER):
        return None if not special or kind == "topic" else _deny(f"{kind} {wire!r} is not a group name")
    if special:
        if kind != "topic":
            return _deny(f"{kind} {wire!r} is not a group name")
        # %RETRY%/%DLQ% topics belong to their consumer group: consuming them, or sending a
        # message back to the retry topic, is the group's subscribe; writing a DLQ is the broker's.
        if special == "DLQ" and action == PUBLISH:
            return _deny(f"topic {wire!r} is a dead-letter queue: only brokers write to it")
        kind = "group"
        if action == PUBLISH:
            action = SUBSCRIBE
    if p.allows(kind, name, action):
        return None
    return _deny(f"{p.subject} may not {action} {kind} {name!r} in tenant {tenant!r}: no grant covers it")
