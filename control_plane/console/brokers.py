"""What the console reads from and sends to the brokers: consumer lag, messages by key or id,
their trace, dead letters and their resending. It goes through ``sdk.admin.AdminClient`` (the
``orbit`` CLI's client) with the signed-in user's own token, so the brokers apply the same
namespace and grant checks to the console as to that user's SDK: a tenant's session reads only
its tenant's queues. The name servers are those of the active broker groups (``/v1/endpoints``).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from aiohttp import web

from control_plane import auth, context
from control_plane.console.render import ConsoleUnavailable
from sdk.admin import AdminClient, AdminError
from sdk.credentials import StaticToken

TIMEOUT_MS = 5000


@contextlib.asynccontextmanager
async def admin_client(request: web.Request) -> AsyncIterator[AdminClient]:
    """An AdminClient signing with this request's token; AdminError leaves as ConsoleUnavailable."""
    token = auth.bearer_token(request)
    groups = await context.services(request).fleet.list_groups()
    addrs = sorted({a for g in groups if g["status"] == "active" for a in g["namesrv_addrs"]})
    if not addrs:
        raise ConsoleUnavailable("no active broker group lists a name server")
    client = AdminClient(addrs, timeout_ms=TIMEOUT_MS, credentials=StaticToken(token))
    try:
        yield client
    except AdminError as e:
        raise ConsoleUnavailable(f"the brokers answered: {e}") from None
    finally:
        await client.close()
