"""TopicConfigManager: the broker's topics (name → queues, permission, order flag), persisted
in ``config/topics.json`` as ``{"topicConfigTable": {...}, "dataVersion": {...}}``.

The data version changes with every change, so name servers know when a registration carries
news. ``TBW102`` is RocketMQ's default topic: published with the inherit permission while
auto-creation is on, it lets a client send to a topic nobody created yet; the broker then
creates the topic with the client's requested queue count (at most the default topic's)."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import Any

from data_plane.broker.persisted import ConfigFile, SaveBehind
from data_plane.remoting.bodies import DataVersion, TopicConfig, topic_config
from data_plane.remoting.codes import PERM_INHERIT, PERM_READ, PERM_READ_WRITE, PERM_WRITE
from data_plane.store.message import validate_topic

DEFAULT_TOPIC = "TBW102"
SELF_TEST_TOPIC = "SELF_TEST_TOPIC"
RETRY_GROUP_TOPIC_PREFIX = "%RETRY%"
DLQ_GROUP_TOPIC_PREFIX = "%DLQ%"
MAX_TOPICS = 1_000_000


class TopicError(ValueError):
    """A topic request that cannot be honoured; the message is the response's remark."""


class TopicConfigManager:
    def __init__(self, path: str, *, broker_name: str, auto_create: bool, default_queue_nums: int, max_queue_nums: int):
        self.file = ConfigFile(path)
        self.broker_name = broker_name
        self.auto_create = auto_create
        self.default_queue_nums = default_queue_nums
        self.max_queue_nums = max_queue_nums
        self.topics: dict[str, TopicConfig] = {}
        self._counter = itertools.count(1)
        self.data_version: DataVersion = {"timestamp": int(time.time() * 1000), "counter": 0}
        self.dirty = False
        # Told of a topic created or changed here, with its write queue count (the broker has
        # its new queues made ahead of their first messages: MessageStore.prepare_queues)
        self.on_written: Callable[[str, int], object] | None = None
        self.save_behind: SaveBehind | None = None  # set by a serving broker (_changed)

    def load(self) -> None:
        doc = self.file.load()
        if doc:
            for name, tc in (doc.get("topicConfigTable") or {}).items():
                self.topics[name] = topic_config(
                    name,
                    int(tc.get("readQueueNums", 1)),
                    int(tc.get("writeQueueNums", 1)),
                    int(tc.get("perm", PERM_READ_WRITE)),
                    bool(tc.get("order", False)),
                    int(tc.get("topicSysFlag", 0)),
                )
            dv = doc.get("dataVersion") or {}
            self.data_version = {
                "timestamp": int(dv.get("timestamp", self.data_version["timestamp"])),
                "counter": int(dv.get("counter", 0)),
            }
            self._counter = itertools.count(self.data_version["counter"] + 1)
        perm = PERM_READ_WRITE | PERM_INHERIT if self.auto_create else PERM_READ_WRITE
        self.topics[DEFAULT_TOPIC] = topic_config(DEFAULT_TOPIC, self.default_queue_nums, self.default_queue_nums, perm)
        self.topics.setdefault(SELF_TEST_TOPIC, topic_config(SELF_TEST_TOPIC, 1, 1))
        self.topics.setdefault(self.broker_name, topic_config(self.broker_name, 1, 1, PERM_READ_WRITE | PERM_INHERIT))

    def snapshot(self) -> dict[str, Any]:
        """The document to save, copied (its topic configs are replaced on change, never
        changed in place), so that it can be written on another thread."""
        return {"topicConfigTable": dict(self.topics), "dataVersion": dict(self.data_version)}

    def persist(self) -> None:
        self.file.save(self.snapshot())
        self.dirty = False

    def _changed(self, behind: bool) -> None:
        """A change, saved now — or, with ``behind`` and a serving broker's ``save_behind``, on
        a worker thread, for a caller that awaits ``save_behind.saved()`` before it answers (an
        admin request: its fsyncs are then not the event loop's, persisted.py). A topic made on
        the data path (a send's auto-creation, a retry or dead-letter topic) is saved now, as
        before: a message acknowledged in it must find its topic after a kill -9."""
        self.data_version = {"timestamp": int(time.time() * 1000), "counter": next(self._counter)}
        if behind and self.save_behind is not None:
            self.save_behind.changed()
        else:
            self.persist()

    def get(self, topic: str) -> TopicConfig | None:
        return self.topics.get(topic)

    def _check_name(self, topic: str) -> None:
        problem = validate_topic(topic)
        if problem is not None:
            raise TopicError(problem)
        if topic == DEFAULT_TOPIC:
            raise TopicError(f"topic {topic} is reserved")
        if topic not in self.topics and len(self.topics) >= MAX_TOPICS:
            raise TopicError(f"the broker holds {MAX_TOPICS} topics already")

    def create_or_update(
        self,
        topic: str,
        *,
        read_queue_nums: int,
        write_queue_nums: int,
        perm: int = PERM_READ_WRITE,
        order: bool = False,
        sys_flag: int = 0,
        behind: bool = False,
    ) -> TopicConfig:
        self._check_name(topic)
        for what, n in (("readQueueNums", read_queue_nums), ("writeQueueNums", write_queue_nums)):
            if not 1 <= n <= self.max_queue_nums:
                raise TopicError(f"{what} {n} is outside 1..{self.max_queue_nums}")
        if perm & ~(PERM_READ_WRITE | PERM_INHERIT):
            raise TopicError(f"perm {perm} is not a combination of 2 (write), 4 (read) and 1 (inherit)")
        tc = topic_config(topic, read_queue_nums, write_queue_nums, perm, order, sys_flag)
        if self.topics.get(topic) != tc:
            self.topics[topic] = tc
            self._changed(behind)
            if self.on_written is not None:
                self.on_written(topic, write_queue_nums)
        return tc

    def create_in_send(self, topic: str, default_topic: str, requested_queue_nums: int) -> TopicConfig | None:
        """Auto-create ``topic`` on its first send through ``default_topic`` (RocketMQ's
        createTopicInSendMessageMethod). None when not allowed."""
        tc = self.topics.get(topic)
        if tc is not None:
            return tc
        default = self.topics.get(default_topic)
        if default is None or not self.auto_create or not default["perm"] & PERM_INHERIT:
            return None
        n = max(1, min(requested_queue_nums, default["writeQueueNums"]))
        return self.create_or_update(topic, read_queue_nums=n, write_queue_nums=n)

    def create_retry_topic(self, group: str) -> bool:
        """Create ``%RETRY%<group>`` (one queue) when a consumer group shows up; True if new."""
        name = RETRY_GROUP_TOPIC_PREFIX + group
        if name in self.topics:
            return False
        self.create_or_update(name, read_queue_nums=1, write_queue_nums=1)
        return True

    def delete(self, topic: str, *, behind: bool = False) -> bool:
        if topic in (DEFAULT_TOPIC, SELF_TEST_TOPIC, self.broker_name) or topic not in self.topics:
            return False
        del self.topics[topic]
        self._changed(behind)
        return True

    def is_readable(self, tc: TopicConfig) -> bool:
        return bool(tc["perm"] & PERM_READ)

    def is_writable(self, tc: TopicConfig) -> bool:
        return bool(tc["perm"] & PERM_WRITE)
