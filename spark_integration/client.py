"""An SDK client for one Spark task (or one planning call): a ``ClientInstance`` with the job's
credentials on a private event loop, driven synchronously (``run``).

Spark runs ``read``/``write`` in Python workers without an event loop; each task opens its own
client here and closes it when done. Authentication and permission failures become an
``OrbitSparkError`` that names the credential (never the secret) and what to check.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Sequence
from typing import Any, TypeVar

from sdk.client_instance import ClientInstance
from sdk.credentials import AuthenticationError, TokenUnavailableError
from sdk.errors import NoPermissionError, OrbitError
from spark_integration.credentials import CredentialSpec, close_credentials
from spark_integration.errors import OrbitSparkError

T = TypeVar("T")

_AUTH_WORDS = ("auth", "token", "signature", "credential", "access key", "accesskey", "denied", "permission")


def translate(e: BaseException, spec: CredentialSpec) -> BaseException:
    """A clear error for a refused credential; other errors unchanged."""
    if isinstance(e, OrbitSparkError):
        return e
    if isinstance(e, AuthenticationError):
        return OrbitSparkError(
            f"Orbit refused the credentials ({spec.describe()}): {e}. "
            "Check the clientId/clientSecret options or ORBIT_CLIENT_ID/ORBIT_CLIENT_SECRET."
        )
    if isinstance(e, TokenUnavailableError):
        return OrbitSparkError(f"no token could be obtained for {spec.describe()}: {e}")
    if isinstance(e, NoPermissionError) or (
        isinstance(e, OrbitError) and any(w in str(e).lower() for w in _AUTH_WORDS)
    ):
        return OrbitSparkError(
            f"the Orbit broker refused the request made with {spec.describe()}: {e}. "
            "Check the credentials and that they grant access to this topic / group."
        )
    return e


class TaskClient:
    def __init__(self, namesrv: Sequence[str], spec: CredentialSpec, *, request_timeout_ms: int = 10_000) -> None:
        self.spec = spec
        self.loop = asyncio.new_event_loop()
        self.credentials: Any = None
        self._namesrv = list(namesrv)
        self._timeout_ms = request_timeout_ms
        try:
            self.instance: ClientInstance = self.loop.run_until_complete(self._open())
        except BaseException:
            self.loop.close()
            raise

    async def _open(self) -> ClientInstance:
        self.credentials = self.spec.sdk_credentials()
        self.tls = self.spec.tls_context()
        return ClientInstance(
            self._namesrv, credentials=self.credentials, request_timeout_ms=self._timeout_ms, tls=self.tls
        )

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        try:
            return self.loop.run_until_complete(coro)
        except Exception as e:
            err = translate(e, self.spec)
            if err is e:
                raise
            raise err from None

    async def check_credentials(self) -> None:
        """Fail fast: obtain a token now (token credentials); signing credentials are checked
        by the first broker request."""
        token = getattr(self.credentials, "token", None)
        if token is not None:
            await token()

    def close(self) -> None:
        if self.loop.is_closed():
            return
        try:
            self.loop.run_until_complete(self._close())
        finally:
            self.loop.close()

    async def _close(self) -> None:
        await self.instance.close()
        await close_credentials(self.credentials)

    def __enter__(self) -> TaskClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
