"""A broker's load report (data_plane/tenancy/load_report.py): what it holds, what it leaves out,
and its bound — built from a real ConsumerOffsetManager and topic table."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from data_plane.broker.config import BrokerConfig, ConfigError
from data_plane.broker.consumer_offset import ConsumerOffsetManager
from data_plane.remoting.bodies import TopicConfig, topic_config
from data_plane.remoting.codes import PERM_READ, PERM_READ_WRITE, PERM_WRITE
from data_plane.tenancy.load_report import LoadReports, Report


class Queues:
    """Max offsets per (topic, queue id), as a store's ConsumeQueues would give them."""

    def __init__(self) -> None:
        self.max: dict[tuple[str, int], int] = {}

    def __call__(self, topic: str, queue_id: int) -> int:
        return self.max.get((topic, queue_id), 0)


@pytest.fixture
def offsets(tmp_path: Path) -> ConsumerOffsetManager:
    return ConsumerOffsetManager(str(tmp_path / "consumerOffset.json"))


def build(
    reports: LoadReports,
    topics: dict[str, TopicConfig],
    offsets: ConsumerOffsetManager,
    queues: Queues,
    now_s: float,
    refused: Counter[str] | None = None,
) -> Report:
    return reports.build(
        now_s=now_s, topics=topics, offset_table=offsets.table, max_offset=queues, refused=refused or Counter()
    )


def keys(report: Report) -> list[tuple[str, ...]]:
    return sorted(i.key for i in report.items)


def test_a_report_holds_tenant_topics_and_their_groups_only(offsets: ConsumerOffsetManager) -> None:
    topics = {
        "acme%orders": topic_config("acme%orders", 2, 3, PERM_READ_WRITE),
        "acme%audit": topic_config("acme%audit", 1, 1, PERM_READ),
        "%RETRY%acme%billing": topic_config("%RETRY%acme%billing", 1, 1),
        "%DLQ%acme%billing": topic_config("%DLQ%acme%billing", 1, 1),
        "ORBIT_SYS_USAGE": topic_config("ORBIT_SYS_USAGE", 1, 1),
        "TBW102": topic_config("TBW102", 8, 8),
    }
    queues = Queues()
    queues.max.update({("acme%orders", 0): 10, ("acme%orders", 1): 7, ("acme%orders", 2): 3, ("TBW102", 0): 99})
    offsets.commit("acme%billing", "acme%orders", 0, 4)
    offsets.commit("acme%billing", "acme%orders", 1, 7)
    offsets.commit("acme%billing", "%RETRY%acme%billing", 0, 1)  # a retry topic: not reported
    offsets.commit("other%spy", "acme%orders", 0, 1)  # another tenant's group on acme's topic: not reported
    offsets.commit("SYS_GROUP", "acme%orders", 0, 1)
    report = build(LoadReports("broker-a"), topics, offsets, queues, 1000.0, Counter({"acme%orders": 2}))
    doc = report.doc
    assert (doc["broker"], doc["at"]) == ("broker-a", 1_000_000)
    by_topic: dict[str, Any] = {t["topic"]: t for t in doc["topics"]}
    assert sorted(by_topic) == ["audit", "orders"]
    orders = by_topic["orders"]
    assert orders["tenant"] == "acme"
    assert orders["refused"] == 2
    # 3 queues: 2 readable, 3 writable
    assert orders["queues"] == [
        {"id": 0, "max_offset": 10, "perm": PERM_READ | PERM_WRITE},
        {"id": 1, "max_offset": 7, "perm": PERM_READ | PERM_WRITE},
        {"id": 2, "max_offset": 3, "perm": PERM_WRITE},
    ]
    assert by_topic["audit"]["queues"] == [{"id": 0, "max_offset": 0, "perm": PERM_READ}]
    assert doc["groups"] == [
        {
            "tenant": "acme",
            "group": "billing",
            "topic": "orders",
            "queues": [{"id": 0, "committed": 4, "max_offset": 10}, {"id": 1, "committed": 7, "max_offset": 7}],
        }
    ]
    assert report.refused == Counter({"acme%orders": 2})


def test_unchanged_items_without_backlog_wait_for_the_refresh(offsets: ConsumerOffsetManager) -> None:
    topics = {"acme%orders": topic_config("acme%orders", 1, 1), "acme%idle": topic_config("acme%idle", 1, 1)}
    queues = Queues()
    queues.max[("acme%orders", 0)] = 5
    offsets.commit("acme%billing", "acme%orders", 0, 5)  # caught up
    reports = LoadReports("broker-a", refresh_s=60.0)
    first = build(reports, topics, offsets, queues, 100.0)
    assert keys(first) == [("g", "acme%billing", "acme%orders"), ("t", "acme%idle"), ("t", "acme%orders")]
    reports.sent(first, now_s=100.0)
    assert build(reports, topics, offsets, queues, 110.0).items == []  # nothing changed
    queues.max[("acme%orders", 0)] = 8  # three more published: the topic changed, the group now has a backlog
    second = build(reports, topics, offsets, queues, 120.0)
    assert keys(second) == [("g", "acme%billing", "acme%orders"), ("t", "acme%orders")]
    reports.sent(second, now_s=120.0)
    # A backlog is reported every time, even unchanged; the topic is not.
    assert keys(build(reports, topics, offsets, queues, 130.0)) == [("g", "acme%billing", "acme%orders")]
    offsets.commit("acme%billing", "acme%orders", 0, 8)
    third = build(reports, topics, offsets, queues, 140.0)
    reports.sent(third, now_s=140.0)
    assert build(reports, topics, offsets, queues, 150.0).items == []
    # Past the refresh, the idle topic (last sent at 100) is sent again; the others later.
    assert keys(build(reports, topics, offsets, queues, 160.0)) == [("t", "acme%idle")]
    assert len(build(reports, topics, offsets, queues, 200.0).items) == 3


def test_an_unsent_report_is_built_again_with_the_numbers_of_then(offsets: ConsumerOffsetManager) -> None:
    topics = {"acme%orders": topic_config("acme%orders", 1, 1)}
    queues = Queues()
    reports = LoadReports("broker-a")
    failed = build(reports, topics, offsets, queues, 100.0)  # never marked sent
    assert failed.doc["topics"][0]["queues"][0]["max_offset"] == 0
    queues.max[("acme%orders", 0)] = 4
    again = build(reports, topics, offsets, queues, 110.0)
    assert again.doc["topics"][0]["queues"][0]["max_offset"] == 4
    assert again.doc["at"] == 110_000


def test_a_report_is_bounded_and_what_is_left_comes_next_oldest_first(offsets: ConsumerOffsetManager) -> None:
    topics = {f"acme%t{i}": topic_config(f"acme%t{i}", 1, 1) for i in range(5)}
    queues = Queues()
    reports = LoadReports("broker-a", max_items=2, refresh_s=1000.0)
    seen: list[tuple[str, ...]] = []
    for n in range(3):
        report = build(reports, topics, offsets, queues, 100.0 + n)
        assert len(report.doc["topics"]) <= 2
        assert report.left_out == [3, 1, 0][n]  # left waiting for the next report
        seen += keys(report)
        reports.sent(report, now_s=100.0 + n)
    assert sorted(seen) == sorted(("t", t) for t in topics)  # each once, none twice
    # A change goes before items only due for their refresh.
    queues.max[("acme%t4", 0)] = 1
    assert keys(build(reports, topics, offsets, queues, 1101.0)) == [("t", "acme%t0"), ("t", "acme%t4")]
    # A deleted topic is forgotten: made again, it is new (due at once, its figures unchanged).
    gone = topics.pop("acme%t1")
    assert ("t", "acme%t1") not in keys(build(reports, topics, offsets, queues, 200.0))
    topics["acme%t1"] = gone
    assert keys(build(reports, topics, offsets, queues, 201.0)) == [("t", "acme%t1"), ("t", "acme%t4")]


@pytest.mark.parametrize(
    "settings",
    [
        {"load_report_interval_s": 0.0},
        {"load_report_max_items": 0},
        {"load_report_refresh_s": 0.5},
    ],
)
def test_load_report_settings_are_validated(settings: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match="load_report_"):
        BrokerConfig(**settings).validate()
    assert BrokerConfig().load_report_interval_s == 10.0
