"""Where a consumer group's progress lives: the next offset to consume, per queue.

* ``RemoteOffsetStore`` (clustering): the broker keeps the group's offsets. QUERY_CONSUMER_OFFSET
  reads one (QUERY_NOT_FOUND: the group never committed on that queue); UPDATE_CONSUMER_OFFSET
  writes one. The consumer updates the table in memory as messages are consumed and persists it
  every ``persist_interval_ms`` (5 s) and at shutdown.
* ``LocalOffsetStore`` (broadcasting): every consumer has its own progress, kept in a JSON file
  per group under a directory, replaced atomically (write a temporary file, fsync, rename).

``update(mq, offset, increase_only=True)`` never moves an offset back unless told to (a seek or
an OFFSET_MOVED answer); ``read`` returns None for "no offset yet".
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

from sdk import protocol
from sdk.client_instance import ClientInstance
from sdk.errors import OrbitError
from sdk.message import MessageQueue

log = logging.getLogger(__name__)


class OffsetStore(Protocol):
    async def load(self) -> None: ...

    def update(self, mq: MessageQueue, offset: int, *, increase_only: bool = True) -> None: ...

    def read_memory(self, mq: MessageQueue) -> int | None: ...

    async def read_store(self, mq: MessageQueue) -> int | None: ...

    async def persist(self, mqs: Iterable[MessageQueue] | None = None, *, sync: bool = False) -> None: ...

    def remove(self, mq: MessageQueue) -> None: ...

    def offsets(self) -> dict[MessageQueue, int]: ...


class _Table:
    def __init__(self) -> None:
        self.table: dict[MessageQueue, int] = {}

    def update(self, mq: MessageQueue, offset: int, *, increase_only: bool = True) -> None:
        if offset < 0:
            return
        old = self.table.get(mq)
        if old is None or not increase_only or offset > old:
            self.table[mq] = offset

    def read_memory(self, mq: MessageQueue) -> int | None:
        return self.table.get(mq)

    def remove(self, mq: MessageQueue) -> None:
        self.table.pop(mq, None)

    def offsets(self) -> dict[MessageQueue, int]:
        return dict(self.table)


class RemoteOffsetStore(_Table):
    """Offsets kept by the broker that hosts each queue."""

    def __init__(self, instance: ClientInstance, group: str) -> None:
        super().__init__()
        self.instance = instance
        self.group = group

    async def load(self) -> None:
        return None

    async def read_store(self, mq: MessageQueue) -> int | None:
        """The broker's committed offset (also cached), or None when the group has none."""
        addr = await self.instance.broker_addr(mq)  # the master, else a slave
        resp = await self.instance.invoke(addr, protocol.query_offset_request(self.group, mq))
        offset = protocol.parse_query_offset_response(resp, addr)
        if offset is not None:
            self.update(mq, offset, increase_only=False)
        return offset

    async def persist(self, mqs: Iterable[MessageQueue] | None = None, *, sync: bool = False) -> None:
        """Send the offsets of ``mqs`` (all when None). ``sync`` waits for each answer and raises
        the first failure; otherwise the updates are oneway and failures are logged."""
        wanted = self.offsets() if mqs is None else {mq: o for mq in mqs if (o := self.table.get(mq)) is not None}
        first_error: OrbitError | None = None
        inst = self.instance
        for mq, offset in sorted(wanted.items()):
            cmd = protocol.update_offset_request(self.group, mq, offset)
            addr = ""
            for attempt in range(2):  # the master (a slave when the route has no master), then another
                try:
                    if attempt == 0:
                        addr = await inst.broker_addr(mq)
                    else:
                        other = inst.find_broker_addr(mq.broker_name, inst.other_broker_id(mq.broker_name, addr))
                        if other is None or other == addr:
                            break
                        addr = other
                    if sync:
                        protocol.check(await inst.invoke(addr, cmd), addr)
                    else:
                        await inst.invoke_oneway(addr, cmd)
                    break
                except OrbitError as e:
                    log.warning("persisting offset %d of %s for group %s at %s failed: %s", offset, mq, self.group,
                                addr or "?", e)  # fmt: skip
                    if attempt == 1 or not e.retriable:
                        first_error = first_error or e
                        break
        if sync and first_error is not None:
            raise first_error


_SAFE = re.compile(r"[^A-Za-z0-9_.%-]")


class LocalOffsetStore(_Table):
    """Offsets in ``<directory>/<instance name>/<group>.json`` (``directory`` default
    ``~/.orbit_offsets``)."""

    def __init__(self, directory: str | os.PathLike[str] | None, instance_name: str, group: str) -> None:
        super().__init__()
        base = Path(directory) if directory is not None else Path.home() / ".orbit_offsets"
        self.path = base / _SAFE.sub("_", instance_name) / f"{_SAFE.sub('_', group)}.json"
        self.group = group
        self._lock = asyncio.Lock()

    async def load(self) -> None:
        self.table.update(await asyncio.to_thread(self._read_file))

    def _read_file(self) -> dict[MessageQueue, int]:
        try:
            raw = self.path.read_text()
        except FileNotFoundError:
            return {}
        try:
            data = json.loads(raw)
            return {
                MessageQueue(str(e["topic"]), str(e["brokerName"]), int(e["queueId"])): int(e["offset"])
                for e in data["offsets"]
            }
        except (ValueError, KeyError, TypeError) as e:
            raise OrbitError(f"offset file {self.path} is not readable: {e}") from None

    async def read_store(self, mq: MessageQueue) -> int | None:
        offset = (await asyncio.to_thread(self._read_file)).get(mq)
        if offset is not None:
            self.update(mq, offset, increase_only=False)
        return offset

    async def persist(self, mqs: Iterable[MessageQueue] | None = None, *, sync: bool = False) -> None:
        """Write the whole table (``mqs`` only selects nothing here: a file holds every queue)."""
        snapshot = self.offsets()
        async with self._lock:
            await asyncio.to_thread(self._write_file, snapshot)

    def _write_file(self, snapshot: dict[MessageQueue, int]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        data = {
            "group": self.group,
            "offsets": [
                {"topic": mq.topic, "brokerName": mq.broker_name, "queueId": mq.queue_id, "offset": off}
                for mq, off in sorted(snapshot.items())
            ],
        }
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "w") as f:
            json.dump(data, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        with contextlib.suppress(OSError):
            fd = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
