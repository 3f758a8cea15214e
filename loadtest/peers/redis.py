"""Redis Streams as a peer: ``redis-server`` (Debian package ``redis-server``) with
``appendonly yes`` and ``appendfsync everysec``, one stream per topic, ``XADD`` (a batch is one
pipeline), consumer groups with ``XREADGROUP`` and ``XACK`` per batch read.

Durability: an ``XADD`` is answered once it is in memory and in the AOF write buffer; the AOF is
written and fsynced once a second — up to about a second of acknowledged writes can be lost on a
power cut (or a crash of Redis itself before the write), the same window as Orbit's ASYNC_FLUSH.
Queues are not a Redis concept: a topic is one stream."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import Any

from loadtest.peers import PeerServer, import_client

DURABILITY = (
    "Redis AOF with appendfsync everysec: acknowledged in memory + AOF buffer, written and fsynced "
    "once a second; up to ~1 s of acknowledged writes lost on a power cut"
)
FIELD = b"d"


def _client() -> Any:
    return import_client("redis.asyncio", requirement="redis>=5,<7")


def _stream(topic: str) -> str:
    return f"load:{topic}"


class RedisServer(PeerServer):
    kind = "redis"
    binary = "redis-server"
    debian_package = "redis-server"

    def argv(self, binary: str, data_dir: str) -> list[str]:
        return [
            binary, "--bind", "127.0.0.1", "--port", str(self.port), "--dir", data_dir,
            "--appendonly", "yes", "--appendfsync", "everysec", "--save", "",
            "--protected-mode", "yes", "--daemonize", "no",
        ]  # fmt: skip

    def spec(self) -> dict[str, Any]:
        return {"kind": "redis", "host": "127.0.0.1", "port": self.port}

    def check_client(self) -> None:
        _client()


class RedisPublisher:
    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.r: Any = None

    async def start(self) -> None:
        self.r = _client().Redis(host=self.spec["host"], port=self.spec["port"])

    async def send(self, topic: str, bodies: list[bytes], key: str | None) -> None:
        if len(bodies) == 1:
            await self.r.xadd(_stream(topic), {FIELD: bodies[0]})
            return
        pipe = self.r.pipeline(transaction=False)
        for b in bodies:
            pipe.xadd(_stream(topic), {FIELD: b})
        await pipe.execute()

    async def close(self) -> None:
        if self.r is not None:
            await self.r.aclose()


class RedisSubscriber:
    def __init__(self, spec: dict[str, Any], *, group: str, topics: list[str], ordered: bool) -> None:
        self.spec = spec
        self.group = group
        self.topics = topics

    async def run(self, on_batch: Callable[[list[bytes]], None], stop: asyncio.Event) -> None:
        redis = _client()
        from redis.exceptions import ResponseError

        r = redis.Redis(host=self.spec["host"], port=self.spec["port"])
        consumer = f"c{os.getpid()}"
        streams = [_stream(t) for t in self.topics]
        try:
            for s in streams:
                try:
                    await r.xgroup_create(s, self.group, id="0", mkstream=True)
                except ResponseError as e:
                    if "BUSYGROUP" not in str(e):
                        raise
            while not stop.is_set():
                got = await r.xreadgroup(self.group, consumer, dict.fromkeys(streams, ">"), count=256, block=200)
                for stream, entries in got or []:
                    if not entries:
                        continue
                    on_batch([fields[FIELD] for _id, fields in entries])
                    await r.xack(stream, self.group, *(i for i, _f in entries))
        finally:
            await r.aclose()
