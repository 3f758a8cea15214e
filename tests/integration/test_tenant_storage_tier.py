"""data_plane/broker/tenant_storage.py on a store with a real tier (data_plane/store/tier against
moto's S3 server over HTTP): a tenant's bytes count as tiered once their CommitLog file is in
object storage only — not while it is uploaded but still on the local disk."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from data_plane.broker.tenant_storage import measure
from data_plane.store import MessageStore
from tests.conftest import ManualClock
from tests.object_store_fixture import object_store_fixture, tier_bucket_fixture  # noqa: F401
from tests.unit.test_tenant_storage import TOPICS, expected, fill

pytestmark = pytest.mark.integration

HOUR_MS = 3_600_000


def test_bytes_are_tiered_once_only_object_storage_holds_them(
    make_store: Callable[..., MessageStore], clock: ManualClock, tier_bucket: tuple[str, str], tmp_path: Path
) -> None:
    endpoint, bucket = tier_bucket
    store = make_store(
        str(tmp_path / "store"),
        tier_url=f"s3://{bucket}/orbit",
        tier_endpoint_url=endpoint,
        tier_group="TestCluster.broker-t",
        local_retention_hours=1.0,
        tier_request_timeout_ms=2_000,
        tier_check_interval_ms=3_600_000,  # rounds are run here
    )
    puts = fill(store, 4)
    before = measure(store, TOPICS)
    assert before == expected(puts, 0)
    assert store.tier is not None
    store.tier.offloader.round()
    assert len(store.tier.manifest.files) == 3  # the sealed files, uploaded
    assert measure(store, TOPICS) == before  # ... and still on the disk: local bytes
    clock.advance(2 * HOUR_MS)
    store.clean_once()  # past local retention: the uploaded files leave the disk
    local_from = store.commit_log.min_offset()
    assert local_from == store.commit_log.mfq.files[-1].file_from_offset > 0
    assert store.min_offset_in_queue("acme%orders", 0) == 0  # the queues still reach back
    measured = measure(store, TOPICS)
    assert measured == expected(puts, local_from)
    for tenant in ("acme", "beta"):
        assert measured.tiered[tenant] > 0
        assert measured.local.get(tenant, 0) + measured.tiered[tenant] == before.local[tenant]
