"""Services: the control plane's rules, one class per resource, bundled in ``Services``.

``Services`` is also the Python API of the control plane for in-process callers (the
reconciler): ``desired_state``, ``mark_topic_active``, ``mint_operator_token`` and
``decrypted_credentials``. ``open_services(settings)`` gives one with its own pool, migrations
applied and a signing key in place.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from control_plane import db
from control_plane.migrate import apply_migrations
from control_plane.names import OPERATOR_TENANT
from control_plane.principal import SYSTEM_SUBJECT
from control_plane.sealing import Sealer
from control_plane.services.credentials import CredentialService, DecryptedCredential
from control_plane.services.desired_state import DesiredState, DesiredStateService
from control_plane.services.fleet import FleetService
from control_plane.services.groups import GroupService
from control_plane.services.ha import HaService
from control_plane.services.load import LoadService
from control_plane.services.tenants import TenantService
from control_plane.services.tokens import TokenService
from control_plane.services.topics import TopicService
from control_plane.services.usage import UsageService
from control_plane.settings import Settings

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Services:
    pool: db.Pool
    settings: Settings
    tokens: TokenService
    credentials: CredentialService
    tenants: TenantService
    fleet: FleetService
    topics: TopicService
    groups: GroupService
    usage: UsageService
    load: LoadService
    desired: DesiredStateService
    ha: HaService

    @classmethod
    def create(cls, pool: db.Pool, settings: Settings) -> Services:
        sealer = Sealer(settings.master_key)
        tokens = TokenService(pool, sealer, settings)
        credentials = CredentialService(pool, sealer, tokens)
        return cls(
            pool=pool,
            settings=settings,
            tokens=tokens,
            credentials=credentials,
            tenants=TenantService(pool),
            fleet=FleetService(pool, credentials),
            topics=TopicService(pool),
            groups=GroupService(pool),
            usage=UsageService(pool),
            load=LoadService(pool, history_hours=settings.load_history_hours),
            desired=DesiredStateService(pool, credentials),
            ha=HaService(pool),
        )

    async def start(self) -> None:
        """Apply migrations, make sure a signing key exists, bootstrap the operator credential."""
        async with self.pool.acquire() as conn:
            applied = await apply_migrations(conn)
        if applied:
            log.info("applied migrations %s", applied)
        await self.tokens.ensure_signing_key()
        if self.settings.bootstrap_credentials_file:
            await self.credentials.bootstrap_operator(self.settings.bootstrap_credentials_file)

    # --- the reconciler's API ---------------------------------------------------------------
    async def desired_state(self, broker_group: str) -> DesiredState:
        return await self.desired.desired_state(broker_group)

    async def mark_topic_active(self, *, tenant_id: str, name: str, broker_group: str | None = None) -> str:
        return await self.topics.mark_active(tenant_id=tenant_id, name=name, broker_group=broker_group)

    async def mint_operator_token(self, *, lifetime_s: int | None = None) -> str:
        """An operator JWT for the control plane's own calls (subject ``orbit-control-plane``)."""
        token, _ = await self.tokens.mint(
            access_key=SYSTEM_SUBJECT, tenant=OPERATOR_TENANT, role="operator", grants=[], lifetime_s=lifetime_s
        )
        return token

    async def decrypted_credentials(self, *, tenant_ids: list[str]) -> list[DecryptedCredential]:
        return await self.credentials.decrypted_credentials(tenant_ids=tenant_ids)


@asynccontextmanager
async def open_services(settings: Settings) -> AsyncIterator[Services]:
    pool = await db.create_pool(settings.database_url, min_size=settings.pool_min_size, max_size=settings.pool_max_size)
    try:
        services = Services.create(pool, settings)
        await services.start()
        yield services
    finally:
        await pool.close()
