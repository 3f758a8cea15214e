"""ReportPoster: POSTs a broker's JSON reports to one path of the control plane with the broker's
own bearer token (``token`` is called for every attempt, so a renewed token is used at once).
The usage reporter (usage_reporter.py) and the load reporter (load_reporter.py) each hold one."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable

import aiohttp
import orjson

from data_plane.tls import http_ssl

TokenSource = Callable[[], str | Awaitable[str]]


class ReportError(Exception):
    """One send failed (transport error or a non-2xx answer)."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class ReportPoster:
    def __init__(
        self,
        control_plane_url: str,
        path: str,
        token: TokenSource,
        *,
        request_timeout_s: float = 10.0,
        session: aiohttp.ClientSession | None = None,
    ) -> None:
        self.url = control_plane_url.rstrip("/") + path
        self._token = token
        self._timeout = aiohttp.ClientTimeout(total=request_timeout_s)
        self._session = session
        self._own_session = session is None

    async def post(self, doc: object) -> None:
        """POST ``doc`` as JSON; raises ReportError unless the answer is 2xx."""
        try:
            bearer = self._token()
            if inspect.isawaitable(bearer):
                bearer = await bearer
        except Exception as e:
            raise ReportError(f"no token: {e!r}") from e
        if self._session is None:
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=http_ssl()))
        headers = {"Authorization": f"Bearer {bearer}", "Content-Type": "application/json"}
        try:
            async with self._session.post(
                self.url, data=orjson.dumps(doc), headers=headers, timeout=self._timeout
            ) as r:
                text = await r.text()
                if not 200 <= r.status < 300:
                    raise ReportError(f"HTTP {r.status}: {text[:200]}", status=r.status)
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            raise ReportError(f"{type(e).__name__}: {e}") from e

    async def close(self) -> None:
        """Close the session it made (a session given to it is the giver's)."""
        if self._own_session and self._session is not None:
            await self._session.close()
            self._session = None
