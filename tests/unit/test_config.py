"""StoreConfig: RocketMQ's defaults, and refusal of settings the store cannot honour (config.py)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from data_plane.store.config import PAGE_SIZE_BYTES, FlushDiskType, StoreConfig
from tests.conftest import small_config

GiB = 1024 * 1024 * 1024
MiB = 1024 * 1024


def test_defaults_are_rocketmq_defaults(tmp_path: Path) -> None:
    cfg = StoreConfig(store_path=str(tmp_path))
    assert cfg.commit_log_file_size_bytes == 1 * GiB
    assert cfg.consume_queue_units_per_file == 300_000
    assert cfg.consume_queue_file_size_bytes == 300_000 * 20
    assert cfg.max_message_size_bytes == 4 * MiB
    assert cfg.file_reserved_time_hours == 72
    assert cfg.flush_disk_type is FlushDiskType.ASYNC_FLUSH
    assert cfg.flush_interval_commit_log_ms == 500
    assert cfg.flush_commit_log_least_pages == 4
    assert cfg.flush_commit_log_thorough_interval_ms == 10_000
    assert cfg.index_hash_slots == 5_000_000
    assert cfg.index_max_entries == 20_000_000
    assert cfg.max_topic_length == 127
    assert cfg.max_properties_size_bytes == 32767
    assert cfg.disk_max_used_space_ratio == 0.75
    assert cfg.disk_space_warning_level_ratio == 0.90
    assert cfg.disk_space_clean_forcibly_ratio == 0.95  # Orbit's: refuse writes before deleting in retention
    assert cfg.disk_usage_override_file == ""
    assert cfg.store_port == 10911
    assert PAGE_SIZE_BYTES == 4096


def test_the_store_directories_follow_rocketmq_layout(tmp_path: Path) -> None:
    cfg = StoreConfig(store_path=str(tmp_path))
    assert cfg.commit_log_path == os.path.join(str(tmp_path), "commitlog")
    assert cfg.consume_queue_path == os.path.join(str(tmp_path), "consumequeue")
    assert cfg.index_path == os.path.join(str(tmp_path), "index")
    assert cfg.checkpoint_path == os.path.join(str(tmp_path), "checkpoint")
    assert cfg.abort_path == os.path.join(str(tmp_path), "abort")


def test_a_config_is_frozen(tmp_path: Path) -> None:
    cfg = StoreConfig(store_path=str(tmp_path))
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.max_message_size_bytes = 1  # type: ignore[misc]


def test_with_changes_returns_a_changed_copy(tmp_path: Path) -> None:
    cfg = StoreConfig(store_path=str(tmp_path))
    changed = cfg.with_changes(flush_disk_type=FlushDiskType.SYNC_FLUSH, file_reserved_time_hours=1.5)
    assert changed.flush_disk_type is FlushDiskType.SYNC_FLUSH
    assert changed.file_reserved_time_hours == 1.5
    assert cfg.flush_disk_type is FlushDiskType.ASYNC_FLUSH


def test_the_small_test_geometry_is_valid(tmp_path: Path) -> None:
    cfg = small_config(str(tmp_path))
    assert cfg.commit_log_file_size_bytes == 64 * 1024


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"commit_log_file_size_bytes": 4095, "max_message_size_bytes": 1024}, "commit_log_file_size_bytes"),
        ({"commit_log_file_size_bytes": 0}, "commit_log_file_size_bytes"),
        ({"commit_log_file_size_bytes": 64 * 1024, "max_message_size_bytes": 63 * 1024 + 1}, "max_message_size"),
        ({"max_message_size_bytes": 1 * GiB}, "max_message_size_bytes"),
        ({"max_topic_length": 0}, "max_topic_length"),
        ({"max_topic_length": 128}, "max_topic_length"),
        ({"max_properties_size_bytes": 0}, "max_properties_size_bytes"),
        ({"max_properties_size_bytes": 32768}, "max_properties_size_bytes"),
        ({"consume_queue_units_per_file": 0}, "consume_queue_units_per_file"),
        ({"index_hash_slots": 0}, "index_hash_slots"),
        ({"index_max_entries": 1}, "index_max_entries"),
        ({"disk_max_used_space_ratio": 0.0}, "disk ratios"),
        ({"disk_max_used_space_ratio": 0.92}, "disk ratios"),
        ({"disk_space_clean_forcibly_ratio": 0.85}, "disk ratios"),  # would delete in retention before refusing
        ({"disk_space_warning_level_ratio": 0.96}, "disk ratios"),
        ({"disk_space_clean_forcibly_ratio": 1.01}, "disk ratios"),
        ({"populate_ahead_bytes": -1}, "populate_ahead_bytes"),
        ({"populate_ahead_bytes": GiB + 1}, "populate_ahead_bytes"),
    ],
)
def test_invalid_settings_raise_value_error_naming_the_problem(
    tmp_path: Path, changes: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message) as info:
        StoreConfig(store_path=str(tmp_path), **changes)  # type: ignore[arg-type]
    assert str(info.value).startswith("invalid StoreConfig: ")


def test_the_limits_themselves_are_accepted(tmp_path: Path) -> None:
    cfg = StoreConfig(
        store_path=str(tmp_path),
        commit_log_file_size_bytes=4096,
        max_message_size_bytes=4096 - 1024,
        max_topic_length=1,
        max_properties_size_bytes=32767,
        consume_queue_units_per_file=1,
        index_hash_slots=1,
        index_max_entries=2,
        disk_max_used_space_ratio=1.0,
        disk_space_clean_forcibly_ratio=1.0,
        disk_space_warning_level_ratio=1.0,
        populate_ahead_bytes=GiB,
    )
    assert cfg.consume_queue_file_size_bytes == 20


def test_every_problem_of_a_config_is_reported_at_once(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="invalid StoreConfig") as info:
        StoreConfig(store_path=str(tmp_path), max_topic_length=200, consume_queue_units_per_file=-1)
    assert "max_topic_length" in str(info.value)
    assert "consume_queue_units_per_file" in str(info.value)


def test_with_changes_checks_the_changed_config_too(tmp_path: Path) -> None:
    cfg = StoreConfig(store_path=str(tmp_path))
    with pytest.raises(ValueError, match="max_topic_length"):
        cfg.with_changes(max_topic_length=500)
