"""UsageTopic: the broker's usage records also as messages of the system topic ORBIT_SYS_USAGE,
for the Spark metering pipeline (spark_integration/pipelines/metering.py).

    UsageMeter.roll_and_spool ─▶ UsageSpool (fsync'd) ─▶ UsageReporter ─▶ control plane (HTTP, as before)
                                        └─▶ UsageTopic.publish ─▶ MessageStore.append: ORBIT_SYS_USAGE, queue 0

One message per record: the body is the record's JSON (``UsageRecord``, the HTTP report's own
form), KEYS is its ``report_id`` (so ``orbit message query --key`` finds it) and TAGS its tenant.
Records are published only once the spool took them, so a minute the spool refused (and the
meter folded into a later one) never reaches the topic twice under two ids.

Turned on by the broker setting ``usage_topic_enabled``; only a master publishes (a slave's
CommitLog is a copy of its master's). The topic is made at start with one queue, readable and
writable by operators only: it is in no tenant's namespace, so a tenant's credential cannot read
it. Delivery: at most once per record in the topic — a kill -9 between the spool's fsync and the
append (a few microseconds on the event loop) loses that roll's records from the topic (the HTTP
reporter still sends them from the spool). Consumers de-duplicate by ``report_id`` or by
position anyway.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

import orjson

from data_plane.store.message import PROPERTY_KEYS, PROPERTY_TAGS, Message

if TYPE_CHECKING:
    from data_plane.broker.topic_config import TopicConfigManager
    from data_plane.store import MessageStore
    from data_plane.tenancy.metering import UsageRecord

log = logging.getLogger(__name__)

USAGE_TOPIC: Final = "ORBIT_SYS_USAGE"
MAX_BATCH: Final = 256  # records per store append


class UsageTopic:
    def __init__(self, store: MessageStore, *, topic: str = USAGE_TOPIC) -> None:
        self.store = store
        self.topic = topic
        self.published = 0
        self.dropped = 0

    def ensure_topic(self, topics: TopicConfigManager) -> None:
        """The topic's config (one queue), so it is routed and can be pulled."""
        if topics.get(self.topic) is None:
            topics.create_or_update(self.topic, read_queue_nums=1, write_queue_nums=1)

    def publish(self, records: Sequence[UsageRecord]) -> int:
        """Append one message per record; how many were stored (a refused append — full disk —
        is logged and counted in ``dropped``)."""
        stored = 0
        for i in range(0, len(records), MAX_BATCH):
            batch = [self._message(r) for r in records[i : i + MAX_BATCH]]
            result, end = self.store.entry.append(batch)
            if end < 0:
                self.dropped += len(batch)
                log.warning(
                    "%d usage records not written to %s: %s",
                    len(batch), self.topic, result.reason or result.status.value,
                )  # fmt: skip
            else:
                stored += len(batch)
        self.published += stored
        return stored

    def _message(self, r: UsageRecord) -> Message:
        props = {PROPERTY_KEYS: r["report_id"], PROPERTY_TAGS: r["tenant"]}
        return Message(self.topic, orjson.dumps(r), 0, 0, props, 0, time.time_ns() // 1_000_000)
