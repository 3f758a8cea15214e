"""ConsumerOffsetManager: committed consume offsets, ``topic@group`` → queue id → offset,
persisted in ``config/consumerOffset.json`` as ``{"offsetTable": {...}}`` (RocketMQ's file).

Commits land in memory at once and reach disk within ``persist_interval_s`` (and at
shutdown), through the atomic ConfigFile; a clean restart therefore loses no commit. The
periodic save writes a snapshot on a worker thread: its fsyncs never stall the event loop."""

from __future__ import annotations

from collections.abc import Callable

from data_plane.broker.persisted import ConfigFile

TOPIC_GROUP_SEPARATOR = "@"


class ConsumerOffsetManager:
    def __init__(self, path: str) -> None:
        self.file = ConfigFile(path)
        self.table: dict[str, dict[int, int]] = {}
        self.dirty = False
        # Told (group, topic, queue id, offset) when a commit moves an offset (the message trace's
        # "consumed" events, data_plane/broker/trace.py); None: no cost beyond this check.
        self.on_advance: Callable[[str, str, int, int], None] | None = None
        # Told every commit while this broker is a slave (replication.py sends them to the master).
        self.on_local_commit: Callable[[str, str, int, int], None] | None = None
        # Told after any change on a master (replication.py sends offsets to slaves soon).
        self.on_commit: Callable[[], None] | None = None

    def load(self) -> None:
        doc = self.file.load()
        if doc:
            for key, queues in (doc.get("offsetTable") or {}).items():
                if isinstance(queues, dict):
                    self.table[key] = {int(q): int(o) for q, o in queues.items()}

    def snapshot(self) -> dict[str, object]:
        """The document to save, copied (cheap: a few dicts) so that it can be written on
        another thread while commits go on."""
        self.dirty = False
        return {"offsetTable": {k: {str(q): o for q, o in v.items()} for k, v in self.table.items()}}

    def persist(self) -> None:
        self.file.save(self.snapshot())

    def commit(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        key = topic + TOPIC_GROUP_SEPARATOR + group
        queues = self.table.get(key)
        if queues is None:
            queues = self.table[key] = {}
        if queues.get(queue_id) != offset:
            queues[queue_id] = offset
            self.dirty = True
            if self.on_advance is not None:
                self.on_advance(group, topic, queue_id, offset)
            if self.on_local_commit is not None:
                self.on_local_commit(group, topic, queue_id, offset)
            if self.on_commit is not None:
                self.on_commit()

    def query(self, group: str, topic: str, queue_id: int) -> int:
        """The committed offset, or -1 when the group never committed for this queue."""
        queues = self.table.get(topic + TOPIC_GROUP_SEPARATOR + group)
        if queues is None:
            return -1
        return queues.get(queue_id, -1)

    def groups_of_topic(self, topic: str) -> set[str]:
        prefix = topic + TOPIC_GROUP_SEPARATOR
        return {k[len(prefix) :] for k in self.table if k.startswith(prefix)}

    def offsets(self, group: str, topic: str) -> dict[int, int]:
        return dict(self.table.get(topic + TOPIC_GROUP_SEPARATOR + group, {}))

    def delete_topic(self, topic: str) -> None:
        prefix = topic + TOPIC_GROUP_SEPARATOR
        for k in [k for k in self.table if k.startswith(prefix)]:
            del self.table[k]
            self.dirty = True
