"""``orbit dev up --tier``'s broker settings: what LocalCluster passes each broker, and the
environment it gives them (data_plane/local_cluster.py, data_plane/local_object_store.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from data_plane.cli.servers import parse_value
from data_plane.local_cluster import TIER_STORE_SETTINGS, LocalCluster, tier_store_settings
from data_plane.local_object_store import LocalObjectStore

pytestmark = pytest.mark.unit

ENDPOINT = "http://127.0.0.1:45678"


def store_sets(args: list[str]) -> list[tuple[str, object]]:
    """The ``--store-set key=value`` pairs in a broker's flags, values as the broker parses them."""
    pairs = [args[i + 1] for i, a in enumerate(args) if a == "--store-set"]
    return [(key, parse_value(value)) for key, _, value in (p.partition("=") for p in pairs)]


def test_the_settings_point_at_the_bucket_under_the_cluster_name() -> None:
    settings = tier_store_settings(ENDPOINT, region="us-east-1", cluster_name="DefaultCluster")
    assert settings == {
        "tier_url": "s3://orbit-tier/DefaultCluster",
        "tier_endpoint_url": ENDPOINT,
        "tier_region": "us-east-1",
        "commit_log_file_size_bytes": 8 * 1024 * 1024,
        "tier_after_hours": 0.0,
        "local_retention_hours": 0.1,
        "tier_check_interval_ms": 5_000,
    }
    assert TIER_STORE_SETTINGS["tier_after_hours"] < TIER_STORE_SETTINGS["local_retention_hours"]


def test_every_broker_gets_the_settings_with_their_types_and_the_developers_store_set_wins(tmp_path: Path) -> None:
    cluster = LocalCluster(str(tmp_path), slaves=1, broker_flags=["--store-set", "local_retention_hours=2"])
    cluster.tier_settings = tier_store_settings(ENDPOINT, region="us-east-1", cluster_name="DefaultCluster")
    for member in (0, 1):
        sets = store_sets(cluster.broker_args(member, "127.0.0.1:9876", []))
        assert sets == [
            ("tier_url", "s3://orbit-tier/DefaultCluster"),
            ("tier_endpoint_url", ENDPOINT),
            ("tier_region", "us-east-1"),
            ("commit_log_file_size_bytes", 8 * 1024 * 1024),
            ("tier_after_hours", 0.0),
            ("local_retention_hours", 0.1),
            ("tier_check_interval_ms", 5_000),
            ("local_retention_hours", 2),  # later wins
        ]


def test_without_tier_no_broker_gets_tier_settings(tmp_path: Path) -> None:
    cluster = LocalCluster(str(tmp_path))
    keys = [key for key, _ in store_sets(cluster.broker_args(0, "127.0.0.1:9876", []))]
    assert not [key for key in keys if key.startswith(("tier_", "local_retention", "commit_log"))]
    assert cluster.broker_env is None
    assert cluster.tier_url == ""


def test_the_environment_replaces_every_aws_variable_of_the_caller(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path / "s3.log", region="eu-west-1")
    caller = {"PATH": "/usr/bin", "AWS_PROFILE": "prod", "AWS_SESSION_TOKEN": "t", "AWS_ACCESS_KEY_ID": "AKIA-real"}
    env = store.environment(caller)
    assert env == {
        "PATH": "/usr/bin",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "eu-west-1",
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_CONFIG_FILE": "/dev/null",
        "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
    }
