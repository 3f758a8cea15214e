"""data_plane/auth/jwks.py: which keys are kept, fetching (callable and URL), the cache file,
periodic and on-demand (rate-limited) refreshes."""

from __future__ import annotations

import asyncio
import base64
import functools
import json
import os
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import jwt
import pytest
import pytest_asyncio
from aiohttp import web
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.rsa import generate_private_key
from jwt.algorithms import OKPAlgorithm, RSAAlgorithm

from data_plane.auth.jwks import JwksCache, JwksError, parse_jwk, parse_jwks
from data_plane.auth.jwt_verifier import TokenVerifier
from tests.integration import helpers
from tests.integration.helpers import Clock, serve_app

until = functools.partial(helpers.until, timeout_s=5.0, every_s=0.01)


def ed_jwk(kid: str) -> tuple[Ed25519PrivateKey, dict[str, Any]]:
    priv = Ed25519PrivateKey.generate()
    jwk: dict[str, Any] = OKPAlgorithm.to_jwk(priv.public_key(), as_dict=True)
    jwk.update(kid=kid, alg="EdDSA", use="sig")
    return priv, jwk


class Source:
    """An async fetcher whose answer (or failure) the test sets."""

    def __init__(self, doc: Mapping[str, Any] | None = None) -> None:
        self.doc = doc
        self.calls = 0
        self.fail = False
        self.gate: asyncio.Event | None = None

    async def __call__(self) -> Mapping[str, Any]:
        self.calls += 1
        if self.gate is not None:
            await self.gate.wait()
        if self.fail or self.doc is None:
            raise OSError("control plane is down")
        return self.doc


# --- parsing ------------------------------------------------------------------------------------
def test_symmetric_and_unsupported_keys_are_skipped() -> None:
    _, good = ed_jwk("good")
    doc = {
        "keys": [
            good,
            {"kty": "oct", "kid": "hmac", "k": base64.urlsafe_b64encode(b"secret").decode(), "alg": "HS256"},
            {"kty": "EC", "kid": "ec", "crv": "P-256", "x": "AA", "y": "AA"},
            {"kty": "OKP", "kid": "x448", "crv": "X448", "x": "AA"},
            {**good, "kid": "enc", "use": "enc"},
            {**good, "kid": "lying", "alg": "RS256"},
            {"kty": "OKP", "crv": "Ed25519", "x": good["x"]},  # no kid
            "not an object",
        ]
    }
    assert sorted(parse_jwks(doc)) == ["good"]


def test_weak_rsa_keys_are_refused() -> None:
    weak = generate_private_key(public_exponent=65537, key_size=1024)
    jwk: dict[str, Any] = RSAAlgorithm.to_jwk(weak.public_key(), as_dict=True)
    jwk["kid"] = "weak"
    with pytest.raises(JwksError, match="under 2048"):
        parse_jwk(jwk)


def test_a_document_without_keys_is_an_error() -> None:
    with pytest.raises(JwksError):
        parse_jwks({"nope": []})


def test_generation_changes_only_when_the_key_set_does() -> None:
    _, a = ed_jwk("a")
    _, b = ed_jwk("b")
    cache = JwksCache(fetcher=Source())
    assert cache.set_jwks({"keys": [a]})
    g = cache.generation
    assert not cache.set_jwks({"keys": [dict(a)]})
    assert cache.generation == g
    assert cache.set_jwks({"keys": [a, b]})
    assert cache.generation == g + 1
    _, a2 = ed_jwk("a")  # same kid, new key material
    assert cache.set_jwks({"keys": [a2, b]})


def test_exactly_one_source_is_required() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        JwksCache()
    with pytest.raises(ValueError, match="exactly one"):
        JwksCache(url="http://x", fetcher=Source())


# --- fetching and the cache file ------------------------------------------------------------------
@pytest.mark.asyncio
async def test_start_fetches_and_persists_public_members_only(tmp_path: Path) -> None:
    _, jwk = ed_jwk("k1")
    leaked = {**jwk, "d": "c2VjcmV0"}  # a control-plane bug must not spread private members
    path = tmp_path / "auth" / "jwks.json"
    cache = JwksCache(fetcher=Source({"keys": [leaked]}), cache_path=str(path))
    await cache.start()
    try:
        assert cache.kids() == ["k1"]
        stored = json.loads(path.read_text())
        assert stored == {"keys": [jwk]}
        assert os.stat(path).st_mode & 0o777 == 0o600
    finally:
        await cache.stop()


@pytest.mark.asyncio
async def test_a_restart_while_the_control_plane_is_down_uses_the_cache_file(tmp_path: Path) -> None:
    priv, jwk = ed_jwk("k1")
    path = str(tmp_path / "jwks.json")
    source = Source({"keys": [jwk]})
    first = JwksCache(fetcher=source, cache_path=path)
    await first.start()
    await first.stop()

    source.fail = True
    second = JwksCache(fetcher=source, cache_path=path, retry_initial_s=3600)
    await second.start()
    try:
        assert second.kids() == ["k1"]
        token = jwt.encode(
            {
                "iss": "orbit",
                "aud": "orbit",
                "sub": "s",
                "tenant": "acme",
                "role": "tenant",
                "grants": [],
                "iat": 1,
                "exp": 2**40,
                "jti": "j",
            },
            priv,
            algorithm="EdDSA",
            headers={"kid": "k1"},
        )
        assert TokenVerifier(second).verify(token).tenant == "acme"
    finally:
        await second.stop()


@pytest.mark.asyncio
async def test_a_failed_fetch_keeps_the_known_keys() -> None:
    _, jwk = ed_jwk("k1")
    source = Source({"keys": [jwk]})
    cache = JwksCache(fetcher=source)
    assert await cache.refresh()
    source.fail = True
    assert not await cache.refresh()
    source.fail = False
    source.doc = {"garbage": True}
    assert not await cache.refresh()
    assert cache.kids() == ["k1"]


@pytest.mark.asyncio
async def test_an_unreadable_cache_file_is_ignored(tmp_path: Path) -> None:
    path = tmp_path / "jwks.json"
    path.write_bytes(b"{torn")
    cache = JwksCache(fetcher=Source(), cache_path=str(path))
    assert not cache.load_cache_file()
    assert len(cache) == 0


@pytest.mark.asyncio
async def test_unknown_kid_refreshes_are_rate_limited() -> None:
    _, k1 = ed_jwk("k1")
    _, k2 = ed_jwk("k2")
    clock = Clock(1000.0)
    source = Source({"keys": [k1]})
    cache = JwksCache(fetcher=source, unknown_kid_min_interval_s=30, clock_s=clock)
    assert await cache.refresh()
    assert source.calls == 1
    assert not await cache.refresh_for_unknown_kid("made-up-1")
    assert source.calls == 2
    assert not cache.unknown_kid_refresh_allowed()
    for i in range(50):  # a flood of made-up kids costs nothing more
        assert not await cache.refresh_for_unknown_kid(f"made-up-{i}")
    assert source.calls == 2
    clock.t += 31
    source.doc = {"keys": [k1, k2]}  # rotation: the next key is published
    assert await cache.refresh_for_unknown_kid("k2")
    assert source.calls == 3
    assert await cache.refresh_for_unknown_kid("k2")  # known now: no fetch
    assert source.calls == 3


@pytest.mark.asyncio
async def test_concurrent_refreshes_share_one_fetch() -> None:
    _, k1 = ed_jwk("k1")
    source = Source({"keys": [k1]})
    source.gate = asyncio.Event()
    cache = JwksCache(fetcher=source)
    tasks = [asyncio.create_task(cache.refresh_for_unknown_kid("k1")) for _ in range(10)]
    await asyncio.sleep(0)
    source.gate.set()
    assert all(await asyncio.gather(*tasks))
    assert source.calls == 1


@pytest.mark.asyncio
async def test_keys_are_refreshed_periodically_and_retried_after_failures() -> None:
    _, k1 = ed_jwk("k1")
    _, k2 = ed_jwk("k2")
    source = Source({"keys": [k1]})
    cache = JwksCache(fetcher=source, refresh_interval_s=0.05, retry_initial_s=0.01)
    await cache.start()
    try:
        source.doc = {"keys": [k2]}
        await until(lambda: cache.kids() == ["k2"])
        source.fail = True
        calls = source.calls
        await until(lambda: source.calls >= calls + 3)  # backoff retries keep going
        assert cache.kids() == ["k2"]
    finally:
        await cache.stop()


# --- over HTTP ------------------------------------------------------------------------------------
@pytest_asyncio.fixture
async def jwks_server() -> AsyncIterator[tuple[str, dict[str, Any]]]:
    state: dict[str, Any] = {"doc": {"keys": []}, "status": 200, "hits": 0}

    async def handler(request: web.Request) -> web.Response:
        state["hits"] += 1
        if state["status"] != 200:
            return web.Response(status=state["status"], text="down")
        return web.json_response(state["doc"])

    app = web.Application()
    app.router.add_get("/.well-known/jwks.json", handler)
    async with serve_app(app) as url:
        yield url + "/.well-known/jwks.json", state


@pytest.mark.asyncio
async def test_keys_are_fetched_from_a_url(jwks_server: tuple[str, dict[str, Any]], tmp_path: Path) -> None:
    url, state = jwks_server
    _, jwk = ed_jwk("k1")
    state["doc"] = {"keys": [jwk]}
    cache = JwksCache(url=url, cache_path=str(tmp_path / "jwks.json"), retry_initial_s=3600)
    await cache.start()
    try:
        assert cache.kids() == ["k1"]
        state["status"] = 503
        assert not await cache.refresh()
        assert cache.kids() == ["k1"]
        assert state["hits"] == 2
    finally:
        await cache.stop()
