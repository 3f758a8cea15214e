"""sdk/credentials.py: OAuth2 client credentials (fetch, cache, background refresh, retries,
fail-fast on 401), static tokens, any TokenProvider, RocketMQ access-key signing — and their use
as the ClientInstance credentials hook. Secrets and tokens never show in repr, str or logs."""

from __future__ import annotations

import asyncio
import base64
import functools
import logging
import urllib.parse
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest
import pytest_asyncio
from aiohttp import web

from data_plane.auth.authorizer import Authorizer
from data_plane.auth.credential_store import CredentialStore
from data_plane.auth.principal import Principal
from data_plane.auth.signature import verify
from data_plane.remoting.codes import FLAG_RESPONSE, RequestCode, ResponseCode
from data_plane.remoting.command import RemotingCommand
from data_plane.remoting.server import Processors, RemotingServer
from sdk.client_instance import ClientInstance
from sdk.credentials import (
    AccessKeyCredentials,
    AuthenticationError,
    ClientCredentials,
    ProviderCredentials,
    StaticToken,
    TokenProvider,
    TokenUnavailableError,
)
from tests.integration import helpers
from tests.integration.helpers import Clock, serve_app

until = functools.partial(helpers.until, timeout_s=5.0, every_s=0.005)

CLIENT_ID = "ci_acme+1"
CLIENT_SECRET = "cs/very:secret=value"
SECRET_KEY = "sk-0123456789-abcdef"


@dataclass
class TokenServer:
    url: str = ""
    statuses: list[int] = field(default_factory=list)  # answers to give before succeeding
    expires_in: int = 3600
    requests: list[dict[str, Any]] = field(default_factory=list)
    issued: list[str] = field(default_factory=list)
    gate: asyncio.Event | None = None


@pytest_asyncio.fixture
async def server() -> AsyncIterator[TokenServer]:
    state = TokenServer()

    async def token(request: web.Request) -> web.Response:
        form = await request.post()
        state.requests.append({"authorization": request.headers.get("Authorization", ""), "form": dict(form)})
        if state.gate is not None:
            await state.gate.wait()
        if state.statuses:
            status = state.statuses.pop(0)
            if status == 401:
                return web.json_response({"error": "invalid_client", "error_description": "bad secret"}, status=401)
            return web.Response(status=status, text="unavailable")
        tok = f"tok-{len(state.issued) + 1}-SECRET-TOKEN-VALUE"
        state.issued.append(tok)
        return web.json_response({"access_token": tok, "token_type": "Bearer", "expires_in": state.expires_in})

    app = web.Application()
    app.router.add_post("/oauth/token", token)
    async with serve_app(app) as url:
        state.url = url + "/oauth/token"
        yield state


def creds(server: TokenServer, **kw: Any) -> ClientCredentials:
    kw.setdefault("backoff_initial_s", 0.001)
    return ClientCredentials(CLIENT_ID, CLIENT_SECRET, server.url, **kw)


# --- ClientCredentials ------------------------------------------------------------------------------
@pytest.mark.asyncio
async def test_tokens_come_from_a_client_credentials_grant_with_basic_auth(server: TokenServer) -> None:
    c = creds(server, scope="orbit")
    try:
        assert await c.token() == server.issued[0]
        req = server.requests[0]
        assert req["form"] == {"grant_type": "client_credentials", "scope": "orbit"}
        scheme, _, encoded = req["authorization"].partition(" ")
        user, _, password = base64.b64decode(encoded).decode().partition(":")
        assert scheme == "Basic"
        assert (urllib.parse.unquote(user), urllib.parse.unquote(password)) == (CLIENT_ID, CLIENT_SECRET)
        assert c(RemotingCommand(10)) == {"Authorization": f"Bearer {server.issued[0]}"}
    finally:
        await c.aclose()


@pytest.mark.asyncio
async def test_the_token_is_cached_until_shortly_before_expiry(server: TokenServer) -> None:
    clock = Clock(100.0)
    c = creds(server, clock_s=clock, refresh_margin_s=60)
    try:
        first = await c.token()
        clock.t += 3000
        assert await c.token() == first
        assert c.ensure_fresh() is None
        assert len(server.requests) == 1
    finally:
        await c.aclose()


@pytest.mark.asyncio
async def test_near_expiry_the_token_is_refreshed_in_the_background(server: TokenServer) -> None:
    clock = Clock(100.0)
    c = creds(server, clock_s=clock, refresh_margin_s=60)
    try:
        await c.token()
        server.gate = asyncio.Event()  # the endpoint is slow now
        clock.t += 3600 - 59  # inside the margin, not expired
        assert c.ensure_fresh() is None  # requests go on with the current token
        assert c(RemotingCommand(10)) == {"Authorization": f"Bearer {server.issued[0]}"}
        await until(lambda: len(server.requests) == 2)
        assert c.ensure_fresh() is None  # one refresh in flight, not one per request
        server.gate.set()
        await until(lambda: len(server.issued) == 2)
        await until(lambda: c(RemotingCommand(10)) == {"Authorization": f"Bearer {server.issued[1]}"})
        assert len(server.requests) == 2
    finally:
        await c.aclose()


@pytest.mark.asyncio
async def test_an_expired_token_is_waited_for(server: TokenServer) -> None:
    clock = Clock(100.0)
    c = creds(server, clock_s=clock)
    try:
        wait = c.ensure_fresh()
        assert wait is not None  # no token yet
        await wait
        clock.t += 3600
        wait = c.ensure_fresh()
        assert wait is not None
        await wait
        assert c(RemotingCommand(10)) == {"Authorization": f"Bearer {server.issued[1]}"}
    finally:
        await c.aclose()


@pytest.mark.asyncio
async def test_concurrent_callers_share_one_request(server: TokenServer) -> None:
    c = creds(server)
    try:
        server.gate = asyncio.Event()
        tasks = [asyncio.create_task(c.token()) for _ in range(20)]
        await until(lambda: len(server.requests) == 1)
        server.gate.set()
        assert set(await asyncio.gather(*tasks)) == {server.issued[0]}
        assert len(server.requests) == 1
    finally:
        await c.aclose()


@pytest.mark.asyncio
async def test_a_refused_client_fails_fast(server: TokenServer) -> None:
    server.statuses = [401]
    c = creds(server, max_attempts=5)
    try:
        with pytest.raises(AuthenticationError) as info:
            await c.token()
        assert info.value.status == 401
        assert "invalid_client" in str(info.value)
        assert CLIENT_ID in str(info.value)
        assert CLIENT_SECRET not in str(info.value)
        assert len(server.requests) == 1  # no retries
    finally:
        await c.aclose()


@pytest.mark.asyncio
async def test_server_errors_are_retried_with_backoff(server: TokenServer) -> None:
    server.statuses = [500, 503, 429]
    c = creds(server, max_attempts=5)
    try:
        assert await c.token() == server.issued[0]
        assert len(server.requests) == 4
    finally:
        await c.aclose()


@pytest.mark.asyncio
async def test_giving_up_after_the_last_attempt(server: TokenServer) -> None:
    server.statuses = [500] * 3
    c = creds(server, max_attempts=3)
    try:
        with pytest.raises(TokenUnavailableError, match="after 3 attempts") as info:
            await c.token()
        assert info.value.retriable
    finally:
        await c.aclose()


@pytest.mark.asyncio
async def test_an_unreachable_endpoint_is_retried_then_reported() -> None:
    c = ClientCredentials(
        CLIENT_ID, CLIENT_SECRET, "http://127.0.0.1:9/oauth/token", max_attempts=2, backoff_initial_s=0.001
    )
    try:
        with pytest.raises(TokenUnavailableError):
            await c.token()
    finally:
        await c.aclose()


@pytest.mark.asyncio
async def test_secrets_and_tokens_never_show(server: TokenServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    server.statuses = [500]
    c = creds(server)
    static = StaticToken("static-SECRET-TOKEN")
    ak = AccessKeyCredentials("AK1", SECRET_KEY)
    try:
        token = await c.token()
        refused = creds(server)
        server.statuses = [401]
        with pytest.raises(AuthenticationError) as info:
            await refused.token()
        await refused.aclose()
        texts = [repr(c), str(c), repr(static), str(static), repr(ak), str(ak), str(info.value), caplog.text]
        for text in texts:
            for secret in (CLIENT_SECRET, token, "static-SECRET-TOKEN", SECRET_KEY, "SECRET-TOKEN"):
                assert secret not in text, (secret, text)
        assert CLIENT_ID in repr(c)
        assert "AK1" in repr(ak)
    finally:
        await c.aclose()


# --- StaticToken, any TokenProvider -------------------------------------------------------------------
@pytest.mark.asyncio
async def test_a_static_token_is_sent_as_is() -> None:
    s = StaticToken("abc.def.ghi")
    assert s.ensure_fresh() is None
    assert await s.token() == "abc.def.ghi"
    assert s(RemotingCommand(10)) == {"Authorization": "Bearer abc.def.ghi"}
    assert isinstance(s, TokenProvider)
    with pytest.raises(ValueError, match="non-empty token"):
        StaticToken("")


def _jwt_with_exp(exp: float) -> str:
    def b64(d: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(orjson.dumps(d)).rstrip(b"=").decode()

    return f"{b64({'alg': 'EdDSA', 'kid': 'k'})}.{b64({'exp': exp})}.c2ln"


class CountingProvider:
    def __init__(self, token: str) -> None:
        self.value = token
        self.calls = 0

    async def token(self) -> str:
        self.calls += 1
        return self.value


@pytest.mark.asyncio
async def test_any_token_provider_is_asked_again_from_shortly_before_exp() -> None:
    import time

    clock = Clock(100.0)
    provider = CountingProvider(_jwt_with_exp(time.time() + 600))
    hook = ProviderCredentials(provider, clock_s=clock, refresh_margin_s=60)
    wait = hook.ensure_fresh()
    assert wait is not None
    await wait
    assert provider.calls == 1
    clock.t += 500
    assert hook.ensure_fresh() is None
    assert provider.calls == 1
    clock.t += 50  # within the margin: a background refresh
    assert hook.ensure_fresh() is None
    await until(lambda: provider.calls == 2)
    await hook.aclose()


# --- AccessKeyCredentials -------------------------------------------------------------------------------
def test_access_key_signing_matches_the_broker_check() -> None:
    ak = AccessKeyCredentials("AK1", SECRET_KEY, ons_channel="ALIYUN", security_token="sts")
    cmd = RemotingCommand(RequestCode.SEND_MESSAGE_V2, ext_fields={"b": "acme%orders", "e": "2"}, body=b"payload")
    extra = ak(cmd)
    assert extra is not None
    assert set(extra) == {"AccessKey", "OnsChannel", "SecurityToken", "Signature"}
    signed = {**(cmd.ext_fields or {}), **extra}
    assert verify(signed, b"payload", SECRET_KEY)
    assert not verify(signed, b"payload", "another-secret")


def test_signing_a_request_twice_gives_the_same_valid_signature() -> None:
    """A retried request already carries the previous AccessKey and Signature."""
    ak = AccessKeyCredentials("AK1", SECRET_KEY)
    cmd = RemotingCommand(RequestCode.PULL_MESSAGE, ext_fields={"topic": "acme%t", "consumerGroup": "acme%g"})
    first = dict(ak(cmd) or {})
    cmd.ext_fields = {**(cmd.ext_fields or {}), **first}
    second = dict(ak(cmd) or {})
    assert first == second
    assert verify({**cmd.ext_fields, **second}, None, SECRET_KEY)


# --- through ClientInstance ------------------------------------------------------------------------------
class FakeRemoting:
    def __init__(self) -> None:
        self.requests: list[tuple[str, RemotingCommand]] = []

    async def invoke(self, addr: str, cmd: RemotingCommand, timeout_ms: int = 3000) -> RemotingCommand:
        self.requests.append((addr, cmd))
        return RemotingCommand(ResponseCode.SUCCESS, flag=FLAG_RESPONSE)

    async def invoke_oneway(self, addr: str, cmd: RemotingCommand) -> None:
        self.requests.append((addr, cmd))

    async def close(self) -> None:
        return None


def instance(credentials: Any) -> tuple[ClientInstance, FakeRemoting]:
    inst = ClientInstance("10.9.9.9:9876", credentials=credentials)
    fake = FakeRemoting()
    inst.remoting = fake  # type: ignore[assignment]
    return inst, fake


@pytest.mark.asyncio
async def test_client_instance_sends_the_current_token_with_every_request(server: TokenServer) -> None:
    c = creds(server)
    inst, fake = instance(c)
    try:
        for _ in range(5):
            await inst.invoke("10.0.0.1:10911", RemotingCommand(RequestCode.HEART_BEAT, body=b"{}"))
        await inst.invoke_oneway("10.0.0.1:10911", RemotingCommand(RequestCode.UPDATE_CONSUMER_OFFSET))
        assert len(server.requests) == 1
        assert all((cmd.ext_fields or {})["Authorization"] == f"Bearer {server.issued[0]}" for _, cmd in fake.requests)
        assert len(fake.requests) == 6
    finally:
        await c.aclose()
        await inst.close()


@pytest.mark.asyncio
async def test_client_instance_fails_fast_when_the_token_endpoint_refuses(server: TokenServer) -> None:
    server.statuses = [401]
    c = creds(server)
    inst, fake = instance(c)
    try:
        with pytest.raises(AuthenticationError):
            await inst.invoke("10.0.0.1:10911", RemotingCommand(RequestCode.HEART_BEAT, body=b"{}"))
        assert fake.requests == []  # nothing was sent without credentials
    finally:
        await c.aclose()
        await inst.close()


@pytest.mark.asyncio
async def test_client_instance_wraps_a_bare_token_provider() -> None:
    provider = CountingProvider("opaque-token")
    inst, fake = instance(provider)
    try:
        for _ in range(3):
            await inst.invoke("10.0.0.1:10911", RemotingCommand(RequestCode.GET_MAX_OFFSET, ext_fields={"topic": "t"}))
        assert provider.calls == 1
        assert (fake.requests[-1][1].ext_fields or {}) == {"topic": "t", "Authorization": "Bearer opaque-token"}
    finally:
        await inst.close()


def test_client_instance_refuses_something_that_is_no_credential() -> None:
    with pytest.raises(TypeError, match="TokenProvider"):
        ClientInstance("10.9.9.9:9876", credentials="secret")  # type: ignore[arg-type]


@pytest.mark.asyncio
async def test_client_instance_requests_signed_with_an_access_key_pass_the_broker() -> None:
    store = CredentialStore()
    store.replace_all(
        [
            {
                "access_key": "AK1",
                "tenant": "acme",
                "role": "tenant",
                "secret": SECRET_KEY,
                "status": "active",
                "grants": [{"resource": "topic", "pattern": "orders", "actions": ["publish"]}],
            }
        ],
        1,
    )
    auth = Authorizer(credentials=store)
    inst, fake = instance(AccessKeyCredentials("AK1", SECRET_KEY))
    try:
        await inst.invoke(
            "10.0.0.1:10911",
            RemotingCommand(RequestCode.SEND_MESSAGE_V2, ext_fields={"a": "acme%pg", "b": "acme%orders"}, body=b"hi"),
        )
        result = auth.check(fake.requests[0][1])
        assert isinstance(result, Principal)
        assert result.subject == "AK1"
    finally:
        await inst.close()


@pytest.mark.asyncio
async def test_the_send_path_lays_a_bearer_token_into_its_frames_and_leaves_signing_to_the_command_path() -> None:
    """``ClientInstance.send_connection``: the open connection and the extFields text a send's
    frame carries — none without credentials, the token's field with a bearer token (the text
    made once a token), and no frame of its own (None) for access-key signing, for a token
    still to fetch, or with no connection open. A real server on 127.0.0.1 holds the connection."""
    server = RemotingServer(Processors())
    await server.start()
    addr = server.address
    provider = CountingProvider("first-token")
    clock = Clock(0.0)
    refreshing = ProviderCredentials(provider, refresh_interval_s=60.0, clock_s=clock)
    cases: list[Any] = [None, StaticToken('tok"en'), refreshing, AccessKeyCredentials("AK1", SECRET_KEY)]
    made: list[ClientInstance] = []
    try:
        for creds in cases:
            inst = ClientInstance(addr, credentials=creds)
            made.append(inst)
            assert inst.send_connection(addr) is None  # no connection open yet
            await inst.remoting.connection(addr)
            got = inst.send_connection(addr)
            if creds is None:
                assert got is not None
                assert got[1] == b""
                assert got[0] is inst.remoting.open_connection(addr)
            elif isinstance(creds, StaticToken):
                assert got is not None
                assert got[1] == b',"Authorization":"Bearer tok\\"en"'
                again = inst.send_connection(addr)
                assert again is not None
                assert again[1] is got[1]  # made once a token
            elif creds is refreshing:
                assert got is None  # no token yet: the command path fetches it
                await refreshing.token()
                got = inst.send_connection(addr)
                assert got is not None
                assert got[1] == b',"Authorization":"Bearer first-token"'
                provider.value = "second-token"
                clock.t = 61.0  # the refresh is due: it starts, this send goes with the current token
                again = inst.send_connection(addr)
                assert again is not None
                assert again[1] == got[1]
                await until(lambda: provider.calls == 2, "the background refresh")

                def text_now(i: ClientInstance = inst) -> bytes:
                    now = i.send_connection(addr)
                    return now[1] if now is not None else b""

                await until(lambda: text_now().endswith(b'second-token"'), "the new token's text")
            else:
                assert got is None  # each request is signed over its own fields and body
    finally:
        for inst in made:
            await inst.close()
        await server.close()
