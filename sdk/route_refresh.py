"""Route refreshes asked for by failures: at most one per topic per short interval.

A broker answering that a topic's queue is not served (``QueueNotServedError``), that the topic
takes no writes there (``TopicNotWritableError``) or is not there (``TopicNotExistError``) means
the client's route of the topic is stale: the topic's queues grew, shrank or moved. The client
refreshes that route at once, without waiting for the periodic refresh
(``route_refresh_interval_ms``, 30 s by default as RocketMQ's pollNameServerInterval) — but
many sends in flight fail together, so ``RouteRefreshLimiter`` makes one fetch of a topic per
``min_interval_s``: an ask within the interval after the last fetch (periodic or asked) is
served once at the interval's end, however many asks there were. Nothing is lost and nothing
storms the name servers.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable

from data_plane.tasks import cancel_all
from sdk.errors import OrbitError

log = logging.getLogger(__name__)

DEFAULT_MIN_INTERVAL_MS = 1000


class RouteRefreshLimiter:
    def __init__(self, fetch: Callable[[str], Awaitable[object]], min_interval_s: float) -> None:
        self._fetch = fetch
        self.min_interval_s = min_interval_s
        self._fetched: dict[str, float] = {}  # topic → loop time of its last fetch
        self._pending: dict[str, asyncio.Task[None]] = {}
        self.asked = 0  # fetches made for asks (for tests and metrics)

    def fetched(self, topic: str) -> None:
        """Note a fetch of ``topic``'s route (any: periodic, on demand or asked)."""
        self._fetched[topic] = asyncio.get_running_loop().time()

    def recent(self, topic: str) -> bool:
        """Whether ``topic``'s route was fetched within the last ``min_interval_s``."""
        at = self._fetched.get(topic, -math.inf)
        return asyncio.get_running_loop().time() - at < self.min_interval_s

    def ask(self, topic: str) -> None:
        """Refresh ``topic``'s route now, or at the end of the interval after its last fetch;
        one pending refresh a topic (an ask while one is pending joins it)."""
        if topic in self._pending:
            return
        loop = asyncio.get_running_loop()
        wait_s = self._fetched.get(topic, -math.inf) + self.min_interval_s - loop.time()
        self._pending[topic] = loop.create_task(self._refresh(topic, max(0.0, wait_s)), name=f"orbit-route-{topic}")

    async def _refresh(self, topic: str, wait_s: float) -> None:
        try:
            if wait_s > 0:
                await asyncio.sleep(wait_s)
            self.asked += 1
            await self._fetch(topic)
        except OrbitError as e:
            log.info("route refresh of %s failed: %s", topic, e)
        finally:
            self._pending.pop(topic, None)

    async def close(self) -> None:
        await cancel_all(list(self._pending.values()))
        self._pending.clear()
