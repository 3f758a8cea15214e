"""A small, thread-safe client of the control plane's HTTP API (standard library only).

It logs in with the OAuth client-credentials grant (``POST /oauth/token``, HTTP Basic), keeps
the JWT until shortly before it expires, and sends it as ``Authorization: Bearer``. A failed
answer raises ``ApiError`` carrying the API's own ``{"error": {"code", "message", "details"}}``.
Neither the client secret nor a token is ever put in a message or a log line.
"""

from __future__ import annotations

import base64
import json
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any

TOKEN_MARGIN_S = 30.0  # a token this close to expiry is renewed first
GET_ATTEMPTS = 3  # reads are retried on connection errors (a restarting control plane)


class ApiError(Exception):
    """An answer other than success, or no answer at all (``status`` 0)."""

    def __init__(self, method: str, path: str, status: int, code: str, message: str, details: Any = None) -> None:
        super().__init__(f"{method} {path}: {status} {code}: {message}")
        self.method = method
        self.path = path
        self.status = status
        self.code = code
        self.message = message
        self.details = details

    @property
    def summary(self) -> str:
        return f"Orbit API error: {self.code}" if self.status else "Orbit control plane unreachable"

    @property
    def detail(self) -> str:
        where = f"{self.method} {self.path}"
        text = (
            f"{where} answered {self.status} {self.code}: {self.message}" if self.status else f"{where}: {self.message}"
        )
        if self.details:
            text += f"\ndetails: {json.dumps(self.details, sort_keys=True)}"
        return text


def _decode_claims(token: str) -> dict[str, Any]:
    """The JWT's claims, unverified (only to learn the credential's own tenant and role)."""
    try:
        payload = token.split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except (IndexError, ValueError):
        return {}
    return claims if isinstance(claims, dict) else {}


@dataclass
class OrbitClient:
    endpoint: str
    client_id: str
    client_secret: str = field(repr=False)
    timeout_s: float = 30.0
    _token: str = field(default="", repr=False)
    _expires_at: float = 0.0
    _claims: dict[str, Any] = field(default_factory=dict)
    _refused: ApiError | None = None  # a refused login is not tried again (failed logins are rate-limited)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        self.endpoint = self.endpoint.rstrip("/")

    # --- tokens -----------------------------------------------------------------------------------
    def token(self, *, renew: bool = False) -> str:
        with self._lock:
            if renew or not self._token or time.monotonic() > self._expires_at - TOKEN_MARGIN_S:
                self._login()
            return self._token

    def _login(self) -> None:
        if self._refused is not None:
            raise self._refused
        basic = base64.b64encode(f"{self.client_id}:{self.client_secret}".encode()).decode()
        status, body = self._send(
            "POST",
            "/oauth/token",
            data=b"grant_type=client_credentials",
            headers={"Authorization": f"Basic {basic}", "Content-Type": "application/x-www-form-urlencoded"},
        )
        if status != 200 or not isinstance(body, dict) or "access_token" not in body:
            error = body if isinstance(body, dict) else {}
            refused = ApiError(
                "POST",
                "/oauth/token",
                status,
                str(error.get("error", "invalid_client")),
                f"cannot log in as client {self.client_id!r}: "
                + str(error.get("error_description", "the token endpoint refused the credential")),
            )
            if status in (400, 401):
                self._refused = refused
            raise refused
        self._token = str(body["access_token"])
        self._expires_at = time.monotonic() + float(body.get("expires_in", 300))
        self._claims = _decode_claims(self._token)

    @property
    def tenant(self) -> str | None:
        """The tenant of a tenant credential (None for operator and broker credentials)."""
        self.token()
        tenant = self._claims.get("tenant")
        return tenant if isinstance(tenant, str) and tenant != "*" else None

    # --- requests ---------------------------------------------------------------------------------
    def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """(status, parsed body) of a request that succeeded (2xx), else ApiError."""
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} if data is not None else {}
        attempts = GET_ATTEMPTS if method == "GET" else 1
        renewed = False
        while True:
            headers["Authorization"] = f"Bearer {self.token()}"
            try:
                status, answer = self._send(method, path, data=data, headers=headers)
            except ApiError:
                attempts -= 1
                if attempts <= 0:
                    raise
                time.sleep(0.5)
                continue
            if status == 401 and not renewed:  # an expired or rotated-out token: once more, freshly
                self.token(renew=True)
                renewed = True
                continue
            if 200 <= status < 300:
                return status, answer
            error = answer.get("error") if isinstance(answer, dict) else None
            if isinstance(error, dict):
                raise ApiError(
                    method,
                    path,
                    status,
                    str(error.get("code", "error")),
                    str(error.get("message", "")),
                    error.get("details") or None,
                )
            raise ApiError(method, path, status, "http_error", str(answer)[:500])

    def get(self, path: str) -> Any:
        return self.call("GET", path)[1]

    def get_or_none(self, path: str) -> Any:
        """The answer, or None when the API says 404 (the resource is gone)."""
        try:
            return self.get(path)
        except ApiError as e:
            if e.status == 404:
                return None
            raise

    def _send(self, method: str, path: str, *, data: bytes | None, headers: dict[str, str]) -> tuple[int, Any]:
        request = urllib.request.Request(self.endpoint + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as resp:
                status, raw = resp.status, resp.read()
        except urllib.error.HTTPError as e:
            status, raw = e.code, e.read()
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise ApiError(method, path, 0, "unreachable", f"{self.endpoint}: {reason}") from None
        if not raw:
            return status, None
        try:
            return status, json.loads(raw)
        except ValueError:
            return status, raw.decode(errors="replace")


def quote(segment: str) -> str:
    """One URL path segment."""
    return urllib.parse.quote(segment, safe="")
