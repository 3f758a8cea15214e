"""JwksCache: the control plane's token-signing public keys, by ``kid``, on the broker.

Fetched from a URL (aiohttp GET, JSON ``{"keys": [...]}``) or from any async fetcher callable
returning that document. Refreshed every ``refresh_interval_s`` (5 min), sooner after a failed
fetch (backoff 1 s … ``refresh_interval_s``), and on demand when a token names an unknown kid —
at most once per ``unknown_kid_min_interval_s``, so a flood of made-up kids costs one fetch.

Only asymmetric public keys are kept: OKP/Ed25519 (alg ``EdDSA``) and RSA of at least 2048 bits
(alg ``RS256``); ``oct`` (symmetric) keys, other curves and private members are ignored. Keys
are decoded once into ``cryptography`` objects; verification (``jwt_verifier``) is synchronous and
looks them up with ``key(kid)``.

Every document that yields keys is written to ``cache_path`` (atomically) and read back by
``start()`` before the first fetch, so a broker restarted while the control plane is down still
verifies tokens. ``generation`` grows whenever the key set changes; the verifier then drops its
cache of verified tokens, so removing a kid from the JWKS revokes its tokens within one refresh.

Key rotation: the control plane publishes the next key before signing with it and keeps the old
key until the last token it signed has expired; a broker that sees a new kid before its next
periodic refresh fetches at once (rate-limited).
"""

from __future__ import annotations

import asyncio
import base64
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

import aiohttp
import orjson
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.rsa import RSAPublicKey, RSAPublicNumbers

from data_plane.auth.files import write_atomic
from data_plane.tasks import cancel_all
from data_plane.tls import http_ssl

log = logging.getLogger(__name__)

Fetcher = Callable[[], Awaitable[Mapping[str, Any]]]
PublicKey = Ed25519PublicKey | RSAPublicKey

MIN_RSA_BITS: Final = 2048
MAX_KEYS: Final = 64
_PRIVATE_MEMBERS: Final = frozenset(("d", "p", "q", "dp", "dq", "qi", "oth", "k"))


class JwksError(Exception):
    """A JWKS document that cannot be used, or a fetch that failed."""


class JwkKey:
    """One verification key: its kid, the algorithm it verifies, the decoded public key."""

    __slots__ = ("alg", "key", "kid")

    def __init__(self, kid: str, alg: str, key: PublicKey) -> None:
        self.kid = kid
        self.alg = alg
        self.key = key

    def __repr__(self) -> str:
        return f"JwkKey(kid={self.kid!r}, alg={self.alg!r})"


def _b64url(s: Any) -> bytes:
    if not isinstance(s, str) or not s:
        raise JwksError("a key member is missing or not a string")
    return base64.urlsafe_b64decode(s + "=" * (-len(s) % 4))


def parse_jwk(jwk: Mapping[str, Any]) -> JwkKey:
    """Decode one public JWK; raises JwksError for symmetric, unknown or weak keys."""
    kid = jwk.get("kid")
    if not isinstance(kid, str) or not kid:
        raise JwksError("a key has no kid")
    kty = jwk.get("kty")
    use = jwk.get("use")
    if use not in (None, "sig"):
        raise JwksError(f"key {kid!r} is for {use!r}, not signatures")
    declared = jwk.get("alg")
    try:
        if kty == "OKP":
            if jwk.get("crv") != "Ed25519":
                raise JwksError(f"key {kid!r}: curve {jwk.get('crv')!r} is not supported (Ed25519 only)")
            alg = "EdDSA"
            x = _b64url(jwk.get("x"))
            if len(x) != 32:
                raise JwksError(f"key {kid!r}: an Ed25519 public key is 32 bytes, not {len(x)}")
            key: PublicKey = Ed25519PublicKey.from_public_bytes(x)
        elif kty == "RSA":
            alg = "RS256"
            n = int.from_bytes(_b64url(jwk.get("n")), "big")
            e = int.from_bytes(_b64url(jwk.get("e")), "big")
            if n.bit_length() < MIN_RSA_BITS:
                raise JwksError(f"key {kid!r}: RSA modulus of {n.bit_length()} bits is under {MIN_RSA_BITS}")
            key = RSAPublicNumbers(e, n).public_key()
        else:
            raise JwksError(f"key {kid!r}: key type {kty!r} is not supported (OKP Ed25519 or RSA only)")
    except (ValueError, TypeError) as err:
        raise JwksError(f"key {kid!r} does not decode: {err}") from None
    if declared is not None and declared != alg:
        raise JwksError(f"key {kid!r} declares alg {declared!r}, but a {kty} key verifies {alg}")
    return JwkKey(kid, alg, key)


def parse_jwks(doc: Mapping[str, Any]) -> dict[str, JwkKey]:
    """The usable keys of a JWKS document by kid (unusable ones are logged and skipped)."""
    keys = doc.get("keys") if isinstance(doc, Mapping) else None
    if not isinstance(keys, list):
        raise JwksError("the JWKS document has no 'keys' list")
    out: dict[str, JwkKey] = {}
    for jwk in keys[:MAX_KEYS]:
        if not isinstance(jwk, Mapping):
            continue
        try:
            k = parse_jwk(jwk)
        except JwksError as e:
            log.warning("JWKS: %s; key skipped", e)
            continue
        if k.kid in out:
            log.warning("JWKS: kid %r appears twice; the first is kept", k.kid)
            continue
        out[k.kid] = k
    return out


class JwksCache:
    def __init__(
        self,
        *,
        url: str | None = None,
        fetcher: Fetcher | None = None,
        cache_path: str | None = None,
        refresh_interval_s: float = 300.0,
        unknown_kid_min_interval_s: float = 30.0,
        fetch_timeout_s: float = 10.0,
        retry_initial_s: float = 1.0,
        clock_s: Callable[[], float] = time.monotonic,
    ) -> None:
        if (url is None) == (fetcher is None):
            raise ValueError("give JwksCache exactly one of url or fetcher")
        self.url = url
        self.cache_path = cache_path
        self.refresh_interval_s = refresh_interval_s
        self.unknown_kid_min_interval_s = unknown_kid_min_interval_s
        self.fetch_timeout_s = fetch_timeout_s
        self.retry_initial_s = retry_initial_s
        self.clock_s = clock_s
        self.generation = 0
        self.last_refresh_ok_s: float | None = None  # clock time of the last successful fetch
        self.fetches = 0
        self._fetcher: Fetcher = fetcher if fetcher is not None else self._fetch_url
        self._keys: dict[str, JwkKey] = {}
        self._session: aiohttp.ClientSession | None = None
        self._task: asyncio.Task[None] | None = None
        self._inflight: asyncio.Future[bool] | None = None
        self._last_on_demand_s = -float("inf")
        self._persisted = False

    # --- lookups (synchronous, hot path) -----------------------------------------------------------
    def key(self, kid: str) -> JwkKey | None:
        return self._keys.get(kid)

    def kids(self) -> list[str]:
        return sorted(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    # --- installing keys ---------------------------------------------------------------------------
    def set_jwks(self, doc: Mapping[str, Any]) -> bool:
        """Install a JWKS document (fetched, from the cache file, or pushed); True when the key
        set changed. Raises JwksError when the document has no keys list."""
        keys = parse_jwks(doc)
        if not keys and self._keys:
            log.warning("JWKS: the new document has no usable key; every token will be refused")
        changed = _fingerprint(keys) != _fingerprint(self._keys)
        self._keys = keys
        if changed:
            self.generation += 1
            log.info("JWKS: keys now %s", sorted(keys))
        return changed

    def persist(self, doc: Mapping[str, Any]) -> None:
        """Write the public members of ``doc``'s keys to the cache file (atomically)."""
        if not self.cache_path:
            return
        keys = [
            {k: v for k, v in jwk.items() if k not in _PRIVATE_MEMBERS}
            for jwk in doc.get("keys", [])[:MAX_KEYS]
            if isinstance(jwk, Mapping)
        ]
        write_atomic(self.cache_path, orjson.dumps({"keys": keys}))

    def load_cache_file(self) -> bool:
        """Install the keys persisted by an earlier run; False when there are none."""
        if not self.cache_path:
            return False
        try:
            with open(self.cache_path, "rb") as f:
                doc = orjson.loads(f.read())
            self.set_jwks(doc)
        except FileNotFoundError:
            return False
        except (OSError, orjson.JSONDecodeError, JwksError) as e:
            log.error("JWKS cache file %s is unusable: %s", self.cache_path, e)
            return False
        log.info("JWKS: %d keys from cache file %s", len(self._keys), self.cache_path)
        return True

    # --- fetching ------------------------------------------------------------------------------------
    async def _fetch_url(self) -> Mapping[str, Any]:
        assert self.url is not None
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.fetch_timeout_s),
                connector=aiohttp.TCPConnector(ssl=http_ssl()),
            )
        async with self._session.get(self.url, headers={"Accept": "application/json"}) as resp:
            if resp.status != 200:
                raise JwksError(f"GET {self.url} answered HTTP {resp.status}")
            doc = orjson.loads(await resp.read())
        if not isinstance(doc, dict):
            raise JwksError(f"GET {self.url} answered JSON that is not an object")
        return doc

    async def refresh(self) -> bool:
        """Fetch and install the key set now (one fetch at a time: concurrent callers share it).
        True when the fetch succeeded; failures are logged and keep the keys we have."""
        if self._inflight is not None:
            return await asyncio.shield(self._inflight)
        fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._inflight = fut
        try:
            ok = await self._refresh_once()
        except BaseException:  # cancelled: waiters see a failed refresh instead of hanging
            fut.set_result(False)
            raise
        finally:
            self._inflight = None
        fut.set_result(ok)
        return ok

    async def _refresh_once(self) -> bool:
        self.fetches += 1
        try:
            doc = await asyncio.wait_for(self._fetcher(), self.fetch_timeout_s)
            changed = self.set_jwks(doc)
        except (JwksError, aiohttp.ClientError, OSError, TimeoutError, orjson.JSONDecodeError, ValueError) as e:
            log.warning("JWKS refresh failed: %s; keeping %d known keys", e, len(self._keys))
            return False
        self.last_refresh_ok_s = self.clock_s()
        if self._keys and (changed or not self._persisted):
            try:
                await asyncio.to_thread(self.persist, doc)
                self._persisted = True
            except OSError as e:
                log.error("JWKS cache file %s not written: %s", self.cache_path, e)
        return True

    async def refresh_for_unknown_kid(self, kid: str) -> bool:
        """Called when a token names ``kid`` and we do not know it: fetch (unless one was made
        for an unknown kid less than ``unknown_kid_min_interval_s`` ago). True when ``kid`` is
        known afterwards."""
        if kid in self._keys:
            return True
        if self._inflight is None:
            now = self.clock_s()
            if now - self._last_on_demand_s < self.unknown_kid_min_interval_s:
                return False
            self._last_on_demand_s = now
        await self.refresh()
        return kid in self._keys

    def unknown_kid_refresh_allowed(self) -> bool:
        """Whether ``refresh_for_unknown_kid`` would fetch (or join a fetch) now."""
        return self._inflight is not None or self.clock_s() - self._last_on_demand_s >= self.unknown_kid_min_interval_s

    # --- life cycle ----------------------------------------------------------------------------------
    async def start(self) -> None:
        """Load the cache file, try one fetch (a control plane that is down is not fatal), then
        refresh in the background."""
        self.load_cache_file()  # a small file, read once at start
        ok = await self.refresh()
        if not ok and not self._keys:
            log.error("JWKS: no keys (fetch failed, no cache file): every JWT is refused until a fetch succeeds")
        self._task = asyncio.get_running_loop().create_task(self._refresh_loop(ok), name="orbit-jwks-refresh")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            await cancel_all([task])
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _refresh_loop(self, last_ok: bool) -> None:
        retry_s = self.retry_initial_s
        while True:
            if last_ok:
                retry_s = self.retry_initial_s
                await asyncio.sleep(self.refresh_interval_s)
            else:
                await asyncio.sleep(retry_s)
                retry_s = min(retry_s * 2, self.refresh_interval_s)
            try:
                last_ok = await self.refresh()
            except Exception:
                log.exception("JWKS refresh failed")
                last_ok = False


def _fingerprint(keys: Mapping[str, JwkKey]) -> frozenset[tuple[str, str, bytes]]:
    return frozenset(
        (
            k.kid,
            k.alg,
            k.key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo),
        )
        for k in keys.values()
    )
