"""data_plane/broker/tenancy.py: the tenancy snapshot's retention maps (total, null for unlimited,
and local) as the broker parses them and applies them to a real MessageStore, and the two storage
quotas — bytes on this broker's disk, bytes in object storage only — that refuse a tenant's sends."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import orjson
import pytest

from data_plane.broker.config import BrokerConfig
from data_plane.broker.tenancy import BrokerTenancy, TenancyError, parse_snapshot
from data_plane.remoting.codes import RequestCode, ResponseCode
from data_plane.remoting.command import RemotingCommand
from data_plane.store import Message, MessageStore, PutMessageStatus

pytestmark = pytest.mark.unit

TOPICS = {"acme%orders": {"writeQueueNums": 1}, "beta%orders": {"writeQueueNums": 1}}
BASE: dict[str, Any] = {"version": 1, "credentials": [], "tenants": []}


def snapshot(**fields: Any) -> bytes:
    return orjson.dumps({**BASE, **fields})


def tenancy_on(store: MessageStore, tmp_path: Path) -> BrokerTenancy:
    """BrokerTenancy on a broker made of what it uses here: its config, store and topics."""
    broker = SimpleNamespace(
        config=BrokerConfig(store_dir=str(tmp_path / "broker")).validate(),
        store=store,
        topics=SimpleNamespace(topics=TOPICS),
    )
    return BrokerTenancy(broker)  # type: ignore[arg-type]


def test_a_null_retention_is_unlimited_and_local_retention_is_a_map_of_its_own() -> None:
    snap = parse_snapshot(
        snapshot(
            topic_retention_hours={"acme%orders": 48, "acme%archive": None},
            topic_local_retention_hours={"acme%orders": 12, "acme%archive": 0.5},
        )
    )
    assert snap["topic_retention_hours"] == {"acme%orders": 48, "acme%archive": None}
    assert snap["topic_local_retention_hours"] == {"acme%orders": 12, "acme%archive": 0.5}
    # A control plane from before tiered storage sends no local map: none is kept.
    assert parse_snapshot(snapshot(topic_retention_hours={"acme%orders": 48}))["topic_local_retention_hours"] == {}


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("topic_retention_hours", {"acme%orders": 0}),
        ("topic_retention_hours", {"acme%orders": 100_001}),
        ("topic_retention_hours", {"acme%orders": "unlimited"}),
        ("topic_retention_hours", {"acme%orders": True}),
        ("topic_retention_hours", ["acme%orders"]),
        ("topic_local_retention_hours", {"acme%orders": None}),
        ("topic_local_retention_hours", {"acme%orders": 0}),
        ("topic_local_retention_hours", {"acme%orders": 8761}),
        ("topic_local_retention_hours", {"acme%orders": "12"}),
        ("topic_local_retention_hours", None),
    ],
)
def test_a_retention_map_that_is_not_hours_is_refused_naming_it(field: str, value: Any) -> None:
    with pytest.raises(TenancyError, match=field):
        parse_snapshot(snapshot(**{field: value}))


@pytest.mark.parametrize("value", [-1, "1", True, 1.5])
def test_a_tiered_share_that_is_not_a_byte_count_is_refused(value: Any) -> None:
    with pytest.raises(TenancyError, match="max_tiered_bytes"):
        parse_snapshot(snapshot(tenants=[{"id": "acme", "status": "active", "max_tiered_bytes": value}]))


def test_the_store_keeps_files_for_good_once_a_topic_here_is_unlimited(
    make_store: Callable[..., MessageStore], tmp_path: Path
) -> None:
    store = make_store()
    tenancy = tenancy_on(store, tmp_path)
    default = store.config.file_reserved_time_hours
    tenancy._apply_tenants(
        parse_snapshot(
            snapshot(
                topic_retention_hours={"acme%orders": 500, "acme%archive": None},
                topic_local_retention_hours={"acme%orders": 6},
            )
        )
    )
    assert store.retention_hours == math.inf
    assert store.topic_retention_hours == {"acme%orders": 500, "acme%archive": math.inf}
    assert store.topic_local_retention_hours == {"acme%orders": 6}
    # The unlimited topic gone: the longest finite promise, and nothing is left unlimited.
    tenancy._apply_tenants(parse_snapshot(snapshot(version=2, topic_retention_hours={"acme%orders": 500})))
    assert store.retention_hours == 500
    assert store.topic_local_retention_hours == {}
    tenancy._apply_tenants(parse_snapshot(snapshot(version=3)))
    assert store.retention_hours == default


def put(store: MessageStore, topic: str, n: int) -> None:
    for _ in range(n):
        result = store.put_messages_blocking([Message(topic, b"m" * 1000)])
        assert result.status is PutMessageStatus.PUT_OK, result
    store.commit_log.mfq.flush_all()


def send(tenancy: BrokerTenancy, topic: str) -> RemotingCommand | None:
    """What the tenancy answers a send of one message to ``topic`` (None: it goes on)."""
    return tenancy.before_put_plain(RemotingCommand(RequestCode.SEND_MESSAGE_V2), topic, 1, 1000)


def test_tiered_bytes_are_metered_apart_and_have_a_quota_of_their_own(
    make_store: Callable[..., MessageStore], tmp_path: Path
) -> None:
    store = make_store()
    put(store, "acme%orders", 150)  # ~3 CommitLog files of 64 KiB
    put(store, "beta%orders", 30)
    store.commit_log.mfq.delete_first_files(2)  # acme's oldest messages now in object storage only
    tenancy = tenancy_on(store, tmp_path)
    measured = tenancy.check_storage()
    acme_local, acme_tiered = measured.local["acme"], measured.tiered["acme"]
    assert acme_tiered > 0
    assert "beta" not in measured.tiered
    # Both gauges go into the next usage record; beta's has no tiered_bytes at all.
    records = {r["tenant"]: r for r in tenancy.meter.roll(tenancy.meter.open_minute + 60_000)}
    assert (records["acme"]["stored_bytes"], records["acme"].get("tiered_bytes")) == (acme_local, acme_tiered)
    assert records["beta"]["stored_bytes"] == measured.local["beta"]
    assert "tiered_bytes" not in records["beta"]

    def shares(acme: dict[str, int | None]) -> bytes:
        return snapshot(tenants=[{"id": "acme", "status": "active", **acme}, {"id": "beta", "status": "active"}])

    # The disk's share counts the local bytes only: room enough here, whatever is tiered.
    tenancy._apply_tenants(parse_snapshot(shares({"storage_bytes": acme_local + 1, "max_tiered_bytes": None})))
    tenancy.check_storage()
    assert send(tenancy, "acme%orders") is None
    # The tiered share is reached: acme's sends are refused, saying which quota; beta's go on.
    tenancy._apply_tenants(parse_snapshot(shares({"storage_bytes": acme_local + 1, "max_tiered_bytes": acme_tiered})))
    tenancy.check_storage()
    refused = send(tenancy, "acme%orders")
    assert refused is not None
    assert refused.code == ResponseCode.FLOW_CONTROL
    assert f"over its storage quota on this broker ({acme_tiered} of {acme_tiered} bytes in object storage" in (
        refused.remark or ""
    )
    assert "retry-after-ms=" in (refused.remark or "")
    assert send(tenancy, "beta%orders") is None
    # And the disk's share, reached, names the disk.
    tenancy._apply_tenants(parse_snapshot(shares({"storage_bytes": acme_local})))
    tenancy.check_storage()
    refused = send(tenancy, "acme%orders")
    assert refused is not None
    assert f"({acme_local} of {acme_local} bytes on disk" in (refused.remark or "")


def refused_for_quota(answer: RemotingCommand | None) -> bool:
    return answer is not None and answer.code == ResponseCode.FLOW_CONTROL


def test_stored_and_delivered_messages_and_each_quota_refusal_are_metered_for_the_tenant(
    make_store: Callable[..., MessageStore], tmp_path: Path
) -> None:
    tenancy = tenancy_on(make_store(), tmp_path)
    limits = {"publish_msgs_per_s": 1, "consume_msgs_per_s": 1}
    tenancy._apply_tenants(parse_snapshot(snapshot(tenants=[{"id": "acme", "status": "active", "limits": limits}])))
    tenancy.after_put("acme%orders", 3)  # a batch of 3 stored
    tenancy.after_put("%RETRY%acme%billing", 1)  # a retry topic is its group's tenant's
    tenancy.after_put("SCHEDULE_TOPIC_XXXX", 5)  # no tenant's
    assert send(tenancy, "acme%orders") is None  # the bucket holds one second: one message
    assert refused_for_quota(send(tenancy, "acme%orders"))
    pull = RemotingCommand(RequestCode.PULL_MESSAGE)
    assert tenancy.before_pull(pull, "acme%orders") is None
    tenancy.after_pull("acme%orders", 4, 400)  # 4 delivered: the consume bucket is in debt
    assert refused_for_quota(tenancy.before_pull(pull, "acme%orders"))
    tenancy.over_storage = frozenset({"acme"})
    assert refused_for_quota(send(tenancy, "acme%orders"))
    assert send(tenancy, "beta%orders") is None  # beta has no limits
    records = {r["tenant"]: r for r in tenancy.meter.roll(tenancy.meter.open_minute + 60_000)}
    acme = records["acme"]
    # Publish quota, consume quota, storage share: three refusals, each once.
    assert (acme.get("messages_in"), acme.get("messages_out"), acme.get("throttled_requests")) == (4, 4, 3)
    assert acme["bytes_out"] == 400
    assert set(records) == {"acme"}  # what passed the quota is counted once stored, not before
