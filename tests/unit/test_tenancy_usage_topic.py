"""data_plane/tenancy/usage_topic.py: the meter's spooled records also as messages of
ORBIT_SYS_USAGE in a real store — one per record, the record's JSON as body, its report id as
key — and nothing published for a minute the spool refused."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from data_plane.broker.topic_config import TopicConfigManager
from data_plane.store import MessageStore
from data_plane.store.message import decode_record
from data_plane.tenancy.metering import MINUTE_MS, UsageMeter
from data_plane.tenancy.usage_spool import UsageSpool
from data_plane.tenancy.usage_topic import USAGE_TOPIC, UsageTopic
from tests.conftest import small_config

pytestmark = [pytest.mark.unit, pytest.mark.asyncio]

T0 = 1_700_000_000_000 - 1_700_000_000_000 % MINUTE_MS


def topic_messages(store: MessageStore) -> list[tuple[dict[str, object], str | None, str | None]]:
    got = store.get_message(USAGE_TOPIC, 0, offset=0, max_msg_nums=1000)
    out = []
    for raw in got.messages:
        m = decode_record(raw)
        out.append((orjson.loads(m.body), m.properties.get("KEYS"), m.properties.get("TAGS")))
        raw.release()
    return out


async def test_spooled_records_become_usage_topic_messages(tmp_path: Path) -> None:
    store = MessageStore(small_config(str(tmp_path / "store")))
    store.start()
    try:
        topics = TopicConfigManager(
            str(tmp_path / "topics.json"), broker_name="b", auto_create=False, default_queue_nums=4, max_queue_nums=8
        )
        usage = UsageTopic(store)
        usage.ensure_topic(topics)
        tc = topics.get(USAGE_TOPIC)
        assert tc is not None
        assert (tc["readQueueNums"], tc["writeQueueNums"]) == (1, 1)
        spool = UsageSpool(str(tmp_path / "usage"))
        meter = UsageMeter("b", spool=spool, clock_ms=lambda: T0 + 5_000, publish=usage.publish)
        meter.record_request("acme", 5000, 0)
        meter.record_request("globex", 10, 20)
        assert await meter.roll_and_spool(T0 + MINUTE_MS) == 2
        spooled = spool.read_batch(10)
        assert spooled is not None
        got = topic_messages(store)
        assert [body for body, _, _ in got] == spooled.records  # the very records, in order
        assert [(key, tag) for _, key, tag in got] == [(f"b:{T0}:acme", "acme"), (f"b:{T0}:globex", "globex")]
        assert usage.published == 2

        # A full spool refuses the next minute: it is folded back, and not published either.
        full = UsageSpool(str(tmp_path / "full"), max_bytes=10)
        refusing = UsageMeter("c", spool=full, clock_ms=lambda: T0 + 5_000, publish=usage.publish)
        refusing.record_request("acme", 1, 0)
        assert await refusing.roll_and_spool(T0 + MINUTE_MS) == 0
        assert len(topic_messages(store)) == 2
    finally:
        store.shutdown()
