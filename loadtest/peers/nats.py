"""NATS JetStream as a peer: ``nats-server -js`` (Debian package ``nats-server``) with a file
store, one stream ``LOAD`` over subjects ``load.<topic>``, a durable pull consumer per consumer
group, each message acknowledged explicitly.

Durability: a publish is acknowledged once the server has written it to its file store; the
file store is fsynced every ``sync_interval`` (JetStream's default, 2 minutes) — so, like
Orbit's ASYNC_FLUSH and Redis' everysec, an acknowledged message survives a process crash but
not a power cut within that window. (``sync: always`` would be the SYNC_FLUSH twin.)"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from loadtest.peers import PeerServer, import_client

DURABILITY = (
    "JetStream file store: publish acknowledged once written to the store file (page cache); "
    "fsync every 2 min (sync_interval default); survives a process crash, not a power cut in that window"
)
STREAM = "LOAD"


def _client() -> Any:
    return import_client("nats", requirement="nats-py>=2.9,<3")


class NatsServer(PeerServer):
    kind = "nats"
    binary = "nats-server"
    debian_package = "nats-server"

    def argv(self, binary: str, data_dir: str) -> list[str]:
        return [binary, "-js", "-sd", data_dir, "-a", "127.0.0.1", "-p", str(self.port)]

    def spec(self) -> dict[str, Any]:
        return {"kind": "nats", "url": f"nats://127.0.0.1:{self.port}"}

    def check_client(self) -> None:
        _client()

    def prepare(self, spec: dict[str, Any], *, topics: list[str], queues: int) -> None:
        """The stream, over every topic's subject."""
        nats = _client()

        async def go() -> None:
            nc = await nats.connect(spec["url"])
            try:
                js = nc.jetstream()
                await js.add_stream(name=STREAM, subjects=[f"load.{t}" for t in topics], storage="file")
            finally:
                await nc.close()

        asyncio.run(go())


class NatsPublisher:
    def __init__(self, spec: dict[str, Any]) -> None:
        self.url = spec["url"]
        self.nc: Any = None
        self.js: Any = None

    async def start(self) -> None:
        self.nc = await _client().connect(self.url)
        self.js = self.nc.jetstream()

    async def send(self, topic: str, bodies: list[bytes], key: str | None) -> None:
        subject = f"load.{topic}"
        if len(bodies) == 1:
            await self.js.publish(subject, bodies[0])
        else:  # a batch: the publishes go out together, each awaits its own ack
            await asyncio.gather(*(self.js.publish(subject, b) for b in bodies))

    async def close(self) -> None:
        if self.nc is not None:
            await self.nc.close()


class NatsSubscriber:
    def __init__(self, spec: dict[str, Any], *, group: str, topics: list[str], ordered: bool) -> None:
        self.url = spec["url"]
        self.group = group
        self.topics = topics

    async def run(self, on_batch: Callable[[list[bytes]], None], stop: asyncio.Event) -> None:
        nats = _client()
        from nats.errors import TimeoutError as NatsTimeout
        from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

        nc = await nats.connect(self.url)
        try:
            js = nc.jetstream()
            config = ConsumerConfig(
                ack_policy=AckPolicy.EXPLICIT, deliver_policy=DeliverPolicy.ALL, max_ack_pending=20_000
            )
            sub = await js.pull_subscribe("load.>", durable=self.group.replace("%", "_"), stream=STREAM, config=config)
            while not stop.is_set():
                try:
                    msgs = await sub.fetch(batch=256, timeout=0.2)
                except (NatsTimeout, TimeoutError):  # nats-py raises either, depending on where it timed out
                    continue
                on_batch([m.data for m in msgs])
                for m in msgs:
                    await m.ack()
        finally:
            await nc.close()
