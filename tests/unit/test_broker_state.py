"""The broker's in-memory and on-disk state, without sockets: topics (TopicConfigManager),
consumer offsets, subscription groups, the atomic ConfigFile, queue locks, the client registry,
held pulls (long polling), tag expressions and the broker's config loading."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from collections.abc import Collection
from pathlib import Path

import pytest

from data_plane.broker.client_manager import MAX_GROUPS_PER_CLIENT, ClientManager
from data_plane.broker.config import BrokerConfig, BrokerRole, ConfigError, advertised_address, load
from data_plane.broker.consumer_offset import ConsumerOffsetManager
from data_plane.broker.long_poll import PullRequestHoldService
from data_plane.broker.persisted import ConfigFile, SaveBehind
from data_plane.broker.pull import MAX_TAGS, parse_tag_expression
from data_plane.broker.rebalance_lock import RebalanceLockManager
from data_plane.broker.subscription_group import SubscriptionGroupManager, default_group
from data_plane.broker.topic_config import DEFAULT_TOPIC, SELF_TEST_TOPIC, TopicConfigManager, TopicError
from data_plane.remoting.codes import PERM_INHERIT, PERM_READ, PERM_READ_WRITE, PERM_WRITE
from data_plane.remoting.connection import Connection
from data_plane.store.config import FlushDiskType

pytestmark = pytest.mark.unit


class FakeClock:
    """An injected ``clock_s``, moved by the test."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def java_hash(s: str) -> int:
    """Java's String.hashCode, written out from its definition (s[0]*31^(n-1) + ... as int32)."""
    h = 0
    data = s.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (h * 31 + int.from_bytes(data[i : i + 2], "big")) % 2**32
    return h - 2**32 if h >= 2**31 else h


# --- TopicConfigManager -----------------------------------------------------------------------
def topics_at(path: Path, *, auto_create: bool = True, default_nums: int = 4, max_nums: int = 64) -> TopicConfigManager:
    m = TopicConfigManager(
        str(path / "config" / "topics.json"),
        broker_name="broker-a",
        auto_create=auto_create,
        default_queue_nums=default_nums,
        max_queue_nums=max_nums,
    )
    m.load()
    return m


def version_of(m: TopicConfigManager) -> tuple[int, int]:
    """A snapshot of the data version (timestamp, counter)."""
    return m.data_version["timestamp"], m.data_version["counter"]


def test_a_new_broker_has_the_system_topics(tmp_path: Path) -> None:
    m = topics_at(tmp_path, default_nums=8)
    tbw = m.get(DEFAULT_TOPIC)
    assert tbw is not None
    assert tbw["readQueueNums"] == tbw["writeQueueNums"] == 8
    assert tbw["perm"] == PERM_READ_WRITE | PERM_INHERIT
    assert m.get(SELF_TEST_TOPIC) is not None
    own = m.get("broker-a")
    assert own is not None
    assert own["perm"] & PERM_INHERIT


def test_without_auto_create_the_default_topic_is_not_inheritable(tmp_path: Path) -> None:
    m = topics_at(tmp_path, auto_create=False)
    tbw = m.get(DEFAULT_TOPIC)
    assert tbw is not None
    assert tbw["perm"] == PERM_READ_WRITE
    assert m.create_in_send("NewTopic", DEFAULT_TOPIC, 4) is None
    assert m.get("NewTopic") is None


def test_create_and_update_a_topic_changes_the_data_version(tmp_path: Path) -> None:
    m = topics_at(tmp_path)
    v0 = version_of(m)
    tc = m.create_or_update("Orders", read_queue_nums=3, write_queue_nums=5, perm=PERM_READ, order=True, sys_flag=2)
    assert tc == {
        "topicName": "Orders",
        "readQueueNums": 3,
        "writeQueueNums": 5,
        "perm": PERM_READ,
        "topicFilterType": "SINGLE_TAG",
        "topicSysFlag": 2,
        "order": True,
    }
    assert m.get("Orders") == tc
    v1 = version_of(m)
    assert v1[1] > v0[1]

    # The same settings again: nothing changed, so the version stays.
    m.create_or_update("Orders", read_queue_nums=3, write_queue_nums=5, perm=PERM_READ, order=True, sys_flag=2)
    assert version_of(m) == v1

    m.create_or_update("Orders", read_queue_nums=8, write_queue_nums=8)
    got = m.get("Orders")
    assert got is not None
    assert (got["readQueueNums"], got["writeQueueNums"], got["perm"], got["order"]) == (8, 8, PERM_READ_WRITE, False)
    assert version_of(m)[1] > v1[1]


@pytest.mark.parametrize(
    ("name", "read", "write", "perm", "says"),
    [
        ("has space", 4, 4, 6, "characters outside"),
        ("", 4, 4, 6, "empty"),
        ("x" * 128, 4, 4, 6, "more than 127"),
        (DEFAULT_TOPIC, 4, 4, 6, "reserved"),
        ("T", 0, 4, 6, "readQueueNums 0"),
        ("T", 4, 65, 6, "writeQueueNums 65"),
        ("T", 4, 4, 8, "perm 8"),
    ],
)
def test_create_refuses_bad_topics(tmp_path: Path, name: str, read: int, write: int, perm: int, says: str) -> None:
    m = topics_at(tmp_path)
    before = version_of(m)
    with pytest.raises(TopicError, match=says):
        m.create_or_update(name, read_queue_nums=read, write_queue_nums=write, perm=perm)
    assert version_of(m) == before
    if name != DEFAULT_TOPIC:
        assert m.get(name) is None


def test_auto_create_through_the_default_topic_caps_the_queue_count(tmp_path: Path) -> None:
    m = topics_at(tmp_path, default_nums=4)
    big = m.create_in_send("Wants16", DEFAULT_TOPIC, 16)
    assert big is not None
    assert (big["readQueueNums"], big["writeQueueNums"]) == (4, 4)
    assert big["perm"] == PERM_READ_WRITE
    small = m.create_in_send("Wants2", DEFAULT_TOPIC, 2)
    assert small is not None
    assert (small["readQueueNums"], small["writeQueueNums"]) == (2, 2)
    # An existing topic is returned unchanged, whatever the client asks for.
    again = m.create_in_send("Wants2", DEFAULT_TOPIC, 4)
    assert again == small


def test_auto_create_needs_an_inheritable_default_topic(tmp_path: Path) -> None:
    m = topics_at(tmp_path)
    m.create_or_update("Plain", read_queue_nums=4, write_queue_nums=4)
    assert m.create_in_send("ViaPlain", "Plain", 4) is None
    assert m.create_in_send("ViaNothing", "NoSuchTopic", 4) is None
    assert m.create_in_send("ViaEmpty", "", 4) is None
    # The broker's own topic is inheritable (RocketMQ's brokerName topic).
    assert m.create_in_send("ViaBroker", "broker-a", 4) is not None
    with pytest.raises(TopicError):
        m.create_in_send("bad name", DEFAULT_TOPIC, 4)


def test_retry_topic_is_created_once_with_one_queue(tmp_path: Path) -> None:
    m = topics_at(tmp_path)
    assert m.create_retry_topic("cg") is True
    tc = m.get("%RETRY%cg")
    assert tc is not None
    assert (tc["readQueueNums"], tc["writeQueueNums"], tc["perm"]) == (1, 1, PERM_READ_WRITE)
    version = version_of(m)
    assert m.create_retry_topic("cg") is False
    assert version_of(m) == version


def test_topics_survive_a_reload(tmp_path: Path) -> None:
    m = topics_at(tmp_path)
    m.create_or_update("A", read_queue_nums=2, write_queue_nums=3, perm=PERM_WRITE, order=True)
    m.create_or_update("B", read_queue_nums=1, write_queue_nums=1)
    version = version_of(m)

    again = topics_at(tmp_path)
    assert again.get("A") == m.get("A")
    assert again.get("B") == m.get("B")
    assert version_of(again) == version
    # The counter goes on from where it was, so name servers see news as news.
    again.create_or_update("C", read_queue_nums=1, write_queue_nums=1)
    assert version_of(again)[1] == version[1] + 1
    on_disk = json.loads((tmp_path / "config" / "topics.json").read_text())
    assert set(on_disk["topicConfigTable"]) >= {"A", "B", "C", DEFAULT_TOPIC}
    assert on_disk["dataVersion"] == again.data_version


def test_delete_a_topic_but_never_a_system_topic(tmp_path: Path) -> None:
    m = topics_at(tmp_path)
    m.create_or_update("Gone", read_queue_nums=1, write_queue_nums=1)
    version = version_of(m)
    assert m.delete("Gone") is True
    assert m.get("Gone") is None
    assert version_of(m)[1] > version[1]
    assert m.delete("Gone") is False
    for system in (DEFAULT_TOPIC, SELF_TEST_TOPIC, "broker-a"):
        assert m.delete(system) is False
        assert m.get(system) is not None
    assert topics_at(tmp_path).get("Gone") is None


# --- ConsumerOffsetManager ----------------------------------------------------------------------
def test_offsets_commit_and_query(tmp_path: Path) -> None:
    m = ConsumerOffsetManager(str(tmp_path / "consumerOffset.json"))
    m.load()
    assert m.query("g", "T", 0) == -1
    dirty_before = m.dirty
    m.commit("g", "T", 0, 17)
    m.commit("g", "T", 3, 5)
    m.commit("other", "T", 0, 2)
    assert (dirty_before, m.dirty) == (False, True)
    assert m.query("g", "T", 0) == 17
    assert m.query("g", "T", 3) == 5
    assert m.query("g", "T", 1) == -1
    assert m.query("other", "T", 0) == 2
    assert m.query("g", "U", 0) == -1
    assert m.offsets("g", "T") == {0: 17, 3: 5}
    assert m.groups_of_topic("T") == {"g", "other"}
    m.commit("g", "T", 0, 9)  # offsets may go back (a reset)
    assert m.query("g", "T", 0) == 9


def test_offsets_persist_and_load(tmp_path: Path) -> None:
    path = str(tmp_path / "consumerOffset.json")
    m = ConsumerOffsetManager(path)
    m.commit("g", "T", 0, 17)
    m.commit("g", "T", 12, 3)
    m.commit("h", "%RETRY%h", 0, 1)
    m.persist()
    assert not m.dirty
    doc = json.loads(Path(path).read_text())
    assert doc == {"offsetTable": {"T@g": {"0": 17, "12": 3}, "%RETRY%h@h": {"0": 1}}}

    again = ConsumerOffsetManager(path)
    again.load()
    assert again.query("g", "T", 0) == 17
    assert again.query("g", "T", 12) == 3
    assert again.query("h", "%RETRY%h", 0) == 1
    assert not again.dirty


def test_deleting_a_topic_drops_its_offsets(tmp_path: Path) -> None:
    m = ConsumerOffsetManager(str(tmp_path / "o.json"))
    m.commit("g", "T", 0, 1)
    m.commit("g", "T2", 0, 2)
    m.persist()
    m.delete_topic("T")
    assert m.dirty
    assert m.query("g", "T", 0) == -1
    assert m.query("g", "T2", 0) == 2


# --- ConfigFile -------------------------------------------------------------------------------
def test_config_file_save_keeps_the_previous_document_as_bak(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "doc.json"
    f = ConfigFile(str(path))  # creates the directory
    assert f.load() is None
    f.save({"v": 1})
    assert json.loads(path.read_text()) == {"v": 1}
    assert not (tmp_path / "sub" / "doc.json.bak").exists()
    f.save({"v": 2})
    assert json.loads(path.read_text()) == {"v": 2}
    assert json.loads((tmp_path / "sub" / "doc.json.bak").read_text()) == {"v": 1}
    assert sorted(os.listdir(tmp_path / "sub")) == ["doc.json", "doc.json.bak"]  # no .tmp left behind
    assert f.load() == {"v": 2}


@pytest.mark.parametrize("damage", [b'{"v": 3', b"\x00\x00\x00\x00", b"[1, 2]", b""])
def test_config_file_load_falls_back_to_bak_when_the_file_is_corrupt(tmp_path: Path, damage: bytes) -> None:
    path = tmp_path / "doc.json"
    f = ConfigFile(str(path))
    f.save({"v": 1})
    f.save({"v": 2})
    path.write_bytes(damage)  # a torn or overwritten file
    assert ConfigFile(str(path)).load() == {"v": 1}


def test_config_file_load_falls_back_to_bak_when_the_file_is_missing(tmp_path: Path) -> None:
    path = tmp_path / "doc.json"
    f = ConfigFile(str(path))
    f.save({"v": 1})
    f.save({"v": 2})
    path.unlink()  # a crash between the two renames of a save
    assert f.load() == {"v": 1}
    f.save({"v": 3})
    assert f.load() == {"v": 3}


def test_config_file_with_nothing_readable_loads_none(tmp_path: Path) -> None:
    path = tmp_path / "doc.json"
    path.write_bytes(b"not json")
    (tmp_path / "doc.json.bak").write_bytes(b"nor this")
    assert ConfigFile(str(path)).load() is None


def test_a_document_copied_before_one_already_saved_is_not_written(tmp_path: Path) -> None:
    """A save finishing on a worker thread after a newer one (the shutdown's) must not put the
    older document back."""
    path = tmp_path / "doc.json"
    f = ConfigFile(str(path))
    older = f.next_seq()  # copied first, written late
    assert f.save({"v": "newer"})
    assert not f.save({"v": "older"}, older)
    assert f.load() == {"v": "newer"}
    later = f.next_seq()
    assert f.save({"v": "latest"}, later)
    assert f.load() == {"v": "latest"}


@pytest.mark.asyncio
async def test_save_behind_writes_the_latest_document_later_and_says_when(tmp_path: Path) -> None:
    path = tmp_path / "conf" / "doc.json"
    f = ConfigFile(str(path))
    state = {"v": 0}
    snapshot_calls = 0

    def snapshot() -> dict[str, object]:
        nonlocal snapshot_calls
        snapshot_calls += 1
        return dict(state)

    behind = SaveBehind(f, snapshot, "the test document")
    for v in range(1, 6):
        state["v"] = v
        behind.changed()
    assert not path.exists(), "nothing written while the caller runs: the save is behind it"
    await behind.saved()
    assert f.load() == {"v": 5}
    assert not behind.dirty
    assert snapshot_calls <= 2, "changes made while a save runs are saved together after it"


@pytest.mark.asyncio
async def test_save_behind_reports_a_failed_save_and_tries_again(tmp_path: Path) -> None:
    conf = tmp_path / "conf"
    f = ConfigFile(str(conf / "doc.json"))
    behind = SaveBehind(f, lambda: {"v": 1}, "the test document")
    shutil.rmtree(conf)  # its directory gone: the write fails
    behind.changed()
    with pytest.raises(FileNotFoundError):
        await behind.saved()
    assert behind.dirty
    conf.mkdir()
    behind.changed()
    await behind.saved()
    assert (behind.dirty, behind.error, f.load()) == (False, None, {"v": 1})


# --- SubscriptionGroupManager -------------------------------------------------------------------
def test_groups_are_auto_created_and_persisted(tmp_path: Path) -> None:
    path = str(tmp_path / "subscriptionGroup.json")
    m = SubscriptionGroupManager(path, auto_create=True)
    m.load()
    g = m.find("cg")
    assert g == default_group("cg")
    assert g is not None
    assert g["consumeEnable"] is True
    assert g["retryMaxTimes"] == 16
    again = SubscriptionGroupManager(path, auto_create=False)
    again.load()
    assert again.find("cg") == default_group("cg")
    assert again.find("unknown") is None
    assert "unknown" not in again.groups


def test_group_update_keeps_known_fields_only_and_survives_reload(tmp_path: Path) -> None:
    path = str(tmp_path / "subscriptionGroup.json")
    m = SubscriptionGroupManager(path, auto_create=False)
    m.load()
    g = m.update("cg", {"consumeEnable": False, "retryMaxTimes": 3, "groupName": "evil", "bogusField": 1})
    assert g["groupName"] == "cg"
    assert g["consumeEnable"] is False
    assert g["retryMaxTimes"] == 3
    assert "bogusField" not in g
    again = SubscriptionGroupManager(path, auto_create=False)
    again.load()
    assert again.find("cg") == g
    assert again.delete("cg") is True
    assert again.delete("cg") is False
    third = SubscriptionGroupManager(path, auto_create=False)
    third.load()
    assert third.find("cg") is None


def test_group_load_fills_in_missing_fields(tmp_path: Path) -> None:
    path = tmp_path / "subscriptionGroup.json"
    path.write_text(json.dumps({"subscriptionGroupTable": {"old": {"groupName": "old", "retryMaxTimes": 5}}}))
    m = SubscriptionGroupManager(str(path), auto_create=False)
    m.load()
    g = m.find("old")
    assert g is not None
    assert g["retryMaxTimes"] == 5
    assert g["consumeEnable"] is True
    assert set(g) == set(default_group("old"))


# --- RebalanceLockManager ---------------------------------------------------------------------
Q0 = ("T", "broker-a", 0)
Q1 = ("T", "broker-a", 1)
Q2 = ("T", "broker-a", 2)


def test_locks_are_exclusive_until_they_expire() -> None:
    clock = FakeClock()
    m = RebalanceLockManager(expiry_s=60.0, clock_s=clock)
    assert m.try_lock_batch("g", [Q0, Q1], "c1") == [Q0, Q1]
    assert m.try_lock_batch("g", [Q1, Q2], "c2") == [Q2]
    assert m.holder("g", Q1) == "c1"
    assert m.holder("g", Q2) == "c2"
    # Another group has its own locks.
    assert m.try_lock_batch("other", [Q0], "c2") == [Q0]

    # c1 renews within the expiry: still its own after two expiry-halves.
    clock.now += 50
    assert m.try_lock_batch("g", [Q0, Q1], "c1") == [Q0, Q1]
    clock.now += 50
    assert m.try_lock_batch("g", [Q0, Q1], "c2") == []
    assert m.holder("g", Q0) == "c1"

    # Not renewed for longer than the expiry: free for another client.
    clock.now += 61
    assert m.holder("g", Q0) is None
    assert m.try_lock_batch("g", [Q0, Q1], "c2") == [Q0, Q1]
    assert m.holder("g", Q0) == "c2"
    assert m.try_lock_batch("g", [Q0], "c1") == []


def test_only_the_holder_can_unlock() -> None:
    m = RebalanceLockManager(expiry_s=60.0, clock_s=FakeClock())
    m.try_lock_batch("g", [Q0, Q1], "c1")
    m.unlock_batch("g", [Q0, Q1], "c2")
    assert m.holder("g", Q0) == "c1"
    assert m.try_lock_batch("g", [Q0], "c2") == []
    m.unlock_batch("g", [Q0], "c1")
    assert m.holder("g", Q0) is None
    assert m.holder("g", Q1) == "c1"
    assert m.try_lock_batch("g", [Q0], "c2") == [Q0]
    m.unlock_batch("nobody-locked-here", [Q0], "c1")  # harmless


# --- ClientManager ----------------------------------------------------------------------------
def consumer_data(group: str, *topics: str, sub: str = "*") -> dict[str, object]:
    return {
        "groupName": group,
        "consumeType": "CONSUME_ACTIVELY",
        "messageModel": "CLUSTERING",
        "consumeFromWhere": "CONSUME_FROM_FIRST_OFFSET",
        "subscriptionDataSet": [{"topic": t, "subString": sub, "subVersion": 1} for t in topics],
    }


@pytest.mark.asyncio
async def test_consumer_registration_reports_membership_changes() -> None:
    m = ClientManager(clock_s=FakeClock())
    c1, c2 = Connection(), Connection()
    assert m.register_consumer(c1, "client-1", consumer_data("g", "T")) is True
    info = m.find_group("g")
    assert info is not None
    assert info.consume_type == "CONSUME_ACTIVELY"
    assert info.consume_from_where == "CONSUME_FROM_FIRST_OFFSET"
    # The same heartbeat again: nothing new.
    assert m.register_consumer(c1, "client-1", consumer_data("g", "T")) is False
    assert m.register_consumer(c2, "client-2", consumer_data("g", "T")) is True
    assert info.client_ids() == ["client-1", "client-2"]
    # A topic added to the subscriptions is a change; a new expression for the same topic is
    # recorded but does not ask for a rebalance (RocketMQ's updateSubscription).
    assert m.register_consumer(c1, "client-1", consumer_data("g", "T", "U")) is True
    assert set(info.subscriptions) == {"T", "U"}
    assert m.register_consumer(c1, "client-1", consumer_data("g", "T", "U", sub="A || B")) is False
    sd = m.subscription("g", "T")
    assert sd is not None
    assert sd["subString"] == "A || B"
    assert m.subscription("g", "V") is None
    assert m.subscription("nope", "T") is None
    # A connection that now says it is another client.
    assert m.register_consumer(c2, "client-2b", consumer_data("g", "T", "U", sub="A || B")) is True
    assert info.client_ids() == ["client-1", "client-2b"]


@pytest.mark.asyncio
async def test_a_closed_connection_leaves_every_group() -> None:
    m = ClientManager(clock_s=FakeClock())
    c1, c2 = Connection(), Connection()
    m.register_consumer(c1, "client-1", consumer_data("g1", "T"))
    m.register_consumer(c1, "client-1", consumer_data("g2", "T"))
    m.register_consumer(c2, "client-2", consumer_data("g1", "T"))
    m.register_producer(c1, "client-1", "pg")
    assert m.producer_connection("pg") is c1
    assert sorted(m.connection_closed(c1)) == ["g1", "g2"]
    info = m.find_group("g1")
    assert info is not None
    assert info.client_ids() == ["client-2"]
    assert m.find_group("g2") is None  # its last member left
    assert m.producer_connection("pg") is None
    assert m.connection_closed(c1) == []  # a second close changes nothing
    assert m.unregister_consumer(c2, "g1") is True
    assert m.find_group("g1") is None
    assert m.unregister_consumer(c2, "g1") is False


@pytest.mark.asyncio
async def test_a_groups_half_sender_is_asked_while_no_member_has_sent_a_heartbeat() -> None:
    m = ClientManager(clock_s=FakeClock())
    sender, later, member = Connection(), Connection(), Connection()
    assert m.producer_connection("pg") is None
    m.note_half_sender(sender, "pg")
    assert m.producer_connection("pg") is sender
    assert m.producer_connection("other") is None
    m.note_half_sender(later, "pg")  # the last half's connection
    assert m.producer_connection("pg") is later
    m.register_producer(member, "p", "pg")  # a member first, as soon as there is one
    assert m.producer_connection("pg") is member
    m.connection_closed(member)
    assert m.producer_connection("pg") is later
    m.connection_closed(sender)  # no longer the group's sender: nothing changes
    assert m.producer_connection("pg") is later
    m.connection_closed(later)
    assert m.producer_connection("pg") is None
    assert m.half_senders == {}
    # Not a registration: a half sender never expires as a silent member would.
    m.note_half_sender(sender, "pg2")
    assert m.expired_connections() == []


@pytest.mark.asyncio
async def test_half_senders_are_bounded_per_connection() -> None:
    m = ClientManager(clock_s=FakeClock())
    conn = Connection()
    for i in range(MAX_GROUPS_PER_CLIENT + 5):
        m.note_half_sender(conn, f"pg{i}")
    assert len(m.half_senders) == MAX_GROUPS_PER_CLIENT
    assert m.producer_connection(f"pg{MAX_GROUPS_PER_CLIENT}") is None
    m.note_half_sender(Connection(), "pg0")  # another connection takes a group over
    m.note_half_sender(conn, "pg-new")  # which frees a place on this one
    assert m.producer_connection("pg-new") is conn


@pytest.mark.asyncio
async def test_silent_connections_expire() -> None:
    clock = FakeClock()
    m = ClientManager(channel_expired_s=120.0, clock_s=clock)
    quiet, chatty, producer = Connection(), Connection(), Connection()
    m.register_consumer(quiet, "q", consumer_data("g", "T"))
    m.register_consumer(chatty, "c", consumer_data("g", "T"))
    m.register_producer(producer, "p", "pg")
    clock.now += 100
    assert m.expired_connections() == []
    m.register_consumer(chatty, "c", consumer_data("g", "T"))  # a heartbeat
    clock.now += 21
    assert set(m.expired_connections()) == {quiet, producer}
    clock.now += 100
    assert set(m.expired_connections()) == {quiet, producer, chatty}


# --- PullRequestHoldService -------------------------------------------------------------------
class Waits:
    """Pulls held under names; ``woken[name]`` is what each one's wake was called with."""

    def __init__(self, s: PullRequestHoldService) -> None:
        self.s = s
        self.woken: dict[str, bool] = {}

    def hold(
        self, name: str, topic: str, queue_id: int, offset: int, timeout_s: float = 30.0,
        tags_codes: frozenset[int] | None = None, owner: object | None = None,
    ) -> bool:  # fmt: skip
        return self.s.hold(topic, queue_id, offset, timeout_s, tags_codes, self._wake, name, owner=owner)

    def _wake(self, name: str, woken: bool) -> None:
        assert name not in self.woken, f"{name} woken twice"
        self.woken[name] = woken

    async def woken_by(self, names: Collection[str], within_s: float = 5.0) -> float:
        """Poll until every one of ``names`` was woken; how long that took from the call (it
        fails past ``within_s``)."""
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        while not set(names) <= set(self.woken):
            assert loop.time() - t0 < within_s, f"not woken within {within_s} s: {set(names) - set(self.woken)}"
            await asyncio.sleep(0.005)
        return loop.time() - t0

    async def settled(self) -> dict[str, bool]:
        await asyncio.sleep(0)  # wakes run soon after, together
        return self.woken


@pytest.mark.asyncio
async def test_a_held_pull_wakes_when_its_offset_is_passed() -> None:
    s = PullRequestHoldService()
    w = Waits(s)
    assert w.hold("a", "T", 0, 5)
    assert w.hold("b", "T", 1, 0)
    assert s.count == 2
    s.notify("T", 0, 5)  # messages up to offset 5 (exclusive): nothing at 5 yet
    s.notify("U", 0, 100)  # another topic
    assert await w.settled() == {}
    s.notify("T", 0, 6)
    assert s.count == 1
    assert w.woken == {}, "woken soon after, not inside the send's notify"
    assert await w.settled() == {"a": True}
    s.wake_all()
    assert await w.settled() == {"a": True, "b": False}
    assert s.count == 0
    assert s.held == {}


@pytest.mark.asyncio
async def test_a_held_pull_wakes_only_for_its_tags() -> None:
    s = PullRequestHoldService()
    w = Waits(s)
    codes = frozenset({java_hash("A"), java_hash("B")})
    assert w.hold("a", "T", 0, 0, tags_codes=codes)
    s.notify("T", 0, 1, java_hash("C"))
    s.notify("T", 0, 2, 0)  # a message without tags
    assert await w.settled() == {}
    s.notify("T", 0, 3, java_hash("B"))
    assert await w.settled() == {"a": True}
    # An arrival of unknown tags wakes every pull.
    assert w.hold("b", "T", 0, 3, tags_codes=codes)
    s.notify("T", 0, 4, None)
    assert await w.settled() == {"a": True, "b": True}
    assert s.count == 0


@pytest.mark.asyncio
async def test_held_pulls_wake_with_false_when_their_suspend_time_ends() -> None:
    s = PullRequestHoldService()
    w = Waits(s)
    assert w.hold("short", "T", 0, 0, 0.05)
    assert w.hold("long", "T", 1, 0, 0.3)
    assert w.hold("short-2", "T", 2, 0, 0.05)
    assert w.hold("woken", "T", 3, 0, 0.05)
    s.notify("T", 3, 1)  # woken before its time: its deadline wakes nothing
    short_s = await w.woken_by({"short", "short-2"})
    assert short_s >= 0.04
    assert w.woken == {"woken": True, "short": False, "short-2": False}
    assert short_s + await w.woken_by({"long"}) >= 0.28
    assert w.woken["long"] is False
    assert (s.count, s.held) == (0, {})
    s.notify("T", 0, 10)  # nothing left to wake
    assert len(await w.settled()) == 4


@pytest.mark.asyncio
async def test_wake_all_wakes_every_held_pull() -> None:
    s = PullRequestHoldService()
    w = Waits(s)
    for q in range(5):
        assert w.hold(str(q), "T", q, 0)
    assert s.count == 5
    s.wake_all()
    assert await w.settled() == {str(q): False for q in range(5)}
    assert s.count == 0


@pytest.mark.asyncio
async def test_releasing_an_owner_wakes_only_its_held_pulls_and_forgets_them() -> None:
    s = PullRequestHoldService()
    w = Waits(s)
    gone, staying = object(), object()
    for q in range(3):
        assert w.hold(f"mine-{q}", "T", q, 0, owner=gone)
    assert w.hold("theirs", "T", 0, 0, owner=staying)
    assert w.hold("woken-before", "T", 7, 0, owner=gone)
    s.notify("T", 7, 1)  # answered before the release: the release leaves it alone
    assert await w.settled() == {"woken-before": True}
    assert s.count == 3 + 1
    assert s.release_owner(gone) == 3
    assert await w.settled() == {"woken-before": True, **{f"mine-{q}": False for q in range(3)}}
    assert s.count == 1
    assert s.release_owner(gone) == 0  # nothing left for it
    s.notify("T", 0, 1)
    assert (await w.settled())["theirs"] is True
    assert (s.count, s.held) == (0, {})


@pytest.mark.asyncio
async def test_held_pulls_are_capped_in_all_and_per_connection() -> None:
    s = PullRequestHoldService(max_held=5, max_per_owner=2)
    w = Waits(s)
    a, b = object(), object()
    assert w.hold("a0", "T", 0, 0, owner=a)
    assert w.hold("a1", "T", 1, 0, owner=a)
    assert not w.hold("a2", "T", 2, 0, owner=a)  # a's third: answered at once
    assert w.hold("b0", "T", 0, 0, owner=b)
    assert w.hold("b1", "T", 1, 0, owner=b)
    assert w.hold("none", "T", 9, 0)  # no owner: only the cap in all
    assert s.count == 5
    assert not w.hold("c", "U", 0, 0, owner=object())  # five held in all
    s.notify("T", 0, 1)  # wakes a's and b's pulls of queue 0
    assert await w.settled() == {"a0": True, "b0": True}
    assert s.count == 3
    assert w.hold("a0-again", "T", 0, 1, owner=a)  # a holds one again, within both caps
    assert not w.hold("a3", "T", 3, 0, owner=a)
    s.wake_all()


@pytest.mark.asyncio
async def test_the_deadline_queue_does_not_keep_pulls_woken_long_ago() -> None:
    """Pulls woken by messages leave their entry in the deadline queue until it reaches the
    front; a compaction keeps the queue within about twice the pulls still held."""
    s = PullRequestHoldService()
    w = Waits(s)
    for i in range(1000):
        assert w.hold(str(i), "T", 0, i, 30.0)
        s.notify("T", 0, i + 1)  # each woken at once
    assert s.count == 0
    (waiting,) = s._deadlines.values()
    assert len(waiting) <= 2 * s.count + 65
    assert len(await w.settled()) == 1000


@pytest.mark.asyncio
async def test_any_number_of_suspend_times_makes_few_deadline_queues_and_each_pull_still_ends() -> None:
    s = PullRequestHoldService()
    w = Waits(s)
    for i in range(250):  # 250 different suspend times, 1 ms apart
        assert w.hold(str(i), "T", i, 0, 0.001 * (i + 1))
    assert len(s._deadlines) == 3  # up to 0.1, 0.2 and 0.3 s
    assert await w.woken_by({str(i) for i in range(250)}) >= 0.25
    assert set(w.woken.values()) == {False}
    assert s.count == 0


@pytest.mark.asyncio
async def test_a_wake_that_fails_does_not_strand_the_pulls_woken_with_it(caplog: pytest.LogCaptureFixture) -> None:
    s = PullRequestHoldService()
    woken: list[str] = []

    def wake(name: str, _woken: bool) -> None:
        if name == "bad":
            raise RuntimeError("boom")
        woken.append(name)

    for name in ("first", "bad", "last"):
        assert s.hold("T", 0, 0, 30.0, None, wake, name)
    s.notify("T", 0, 1)
    await asyncio.sleep(0)
    assert woken == ["first", "last"]
    assert "waking a held pull failed" in caplog.text


# --- parse_tag_expression ---------------------------------------------------------------------
@pytest.mark.parametrize("expr", [None, "", "   ", "*", " * "])
def test_every_tag_expressions(expr: str | None) -> None:
    assert parse_tag_expression(expr) is None


@pytest.mark.parametrize("expr", ["||", " || ", "|| ||"])
def test_an_expression_naming_no_tag_matches_nothing(expr: str) -> None:
    assert parse_tag_expression(expr) == frozenset()


def test_tag_expression_is_java_hash_codes() -> None:
    assert parse_tag_expression("TagA") == frozenset({java_hash("TagA")})
    assert java_hash("TagA") == 2598919
    assert parse_tag_expression(" A ||  || B ") == frozenset({java_hash("A"), java_hash("B")})
    long_tag = "a-tag-long-enough-to-overflow-an-int-" * 3
    assert java_hash(long_tag) != java_hash(long_tag[:-1])
    assert parse_tag_expression(f"{long_tag}||x") == frozenset({java_hash(long_tag), java_hash("x")})


def test_too_many_tags_is_an_error() -> None:
    assert parse_tag_expression(" || ".join(f"t{i}" for i in range(MAX_TAGS))) is not None
    with pytest.raises(ValueError, match="more than"):
        parse_tag_expression(" || ".join(f"t{i}" for i in range(MAX_TAGS + 1)))


# --- broker config ----------------------------------------------------------------------------
def test_config_defaults() -> None:
    c = load()
    assert c == BrokerConfig()
    assert c.is_master
    assert c.listen_port == 10911
    assert advertised_address(c, 1234) == "127.0.0.1:1234"
    assert advertised_address(load(overrides={"listen": "0.0.0.0:1"}), 9) == "127.0.0.1:9"
    assert advertised_address(load(overrides={"advertised_host": "10.0.0.5"}), 9) == "10.0.0.5:9"
    assert (c.advertised_port, c.ha_advertised) == (0, "")


def test_an_advertised_port_is_published_and_written_into_message_ids() -> None:
    """A broker behind a proxy: clients and message ids name the proxy's port, not the bound one."""
    c = load(overrides={"listen": "127.0.0.1:0", "advertised_port": "20911", "ha_advertised": "127.0.0.1:20912"})
    assert advertised_address(c, 41234) == "127.0.0.1:20911"
    sc = c.store_config(41234)
    assert (sc.store_host, sc.store_port) == ("127.0.0.1", 20911)
    assert c.ha_advertised == "127.0.0.1:20912"
    assert load(overrides={"advertised_port": 0}).store_config(41234).store_port == 41234


def test_config_from_toml_with_overrides(tmp_path: Path) -> None:
    path = tmp_path / "broker.toml"
    path.write_text(
        'broker_name = "broker-b"\n'
        'cluster_name = "C1"\n'
        'listen = "127.0.0.1:0"\n'
        'namesrv_addrs = ["127.0.0.1:9876", "127.0.0.1:9877"]\n'
        "default_topic_queue_nums = 8\n"
        "auto_create_topic_enable = false\n"
        f'store_dir = "{tmp_path / "data"}"\n'
        "[store]\n"
        'flush_disk_type = "SYNC_FLUSH"\n'
        "commit_log_file_size_bytes = 8388608\n"
        "index_hash_slots = 1024\n"
    )
    c = load(str(path), {"cluster_name": "C2", "broker_role": None, "store": {"index_hash_slots": 2048}})
    assert c.broker_name == "broker-b"
    assert c.cluster_name == "C2"  # the flag wins
    assert c.broker_role is BrokerRole.ASYNC_MASTER  # None means "not given"
    assert c.namesrv_addrs == ("127.0.0.1:9876", "127.0.0.1:9877")
    assert c.default_topic_queue_nums == 8
    assert c.auto_create_topic_enable is False
    sc = c.store_config(4321)
    assert sc.flush_disk_type is FlushDiskType.SYNC_FLUSH
    assert sc.commit_log_file_size_bytes == 8388608  # kept from the file
    assert sc.index_hash_slots == 2048  # the flag's store setting merged over the file's
    assert sc.store_path == os.path.join(str(tmp_path / "data"), "store")
    assert (sc.store_host, sc.store_port) == ("127.0.0.1", 4321)


def test_config_string_forms_of_flags() -> None:
    c = load(
        overrides={
            "namesrv_addrs": "a:1; b:2,c:3",
            "long_polling_enable": "false",
            "max_suspend_ms": "1500",
            "register_interval_s": "2.5",
            "broker_role": "slave",
            "broker_id": "1",
        }
    )
    assert c.namesrv_addrs == ("a:1", "b:2", "c:3")
    assert c.long_polling_enable is False
    assert c.max_suspend_ms == 1500
    assert c.register_interval_s == 2.5
    assert c.broker_role is BrokerRole.SLAVE
    assert not c.is_master


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        ({"no_such_setting": 1}, "unknown broker setting 'no_such_setting'"),
        ({"max_suspend_ms": "soon"}, "setting 'max_suspend_ms'"),
        ({"register_interval_s": "x"}, "setting 'register_interval_s'"),
        ({"broker_role": "LEADER"}, "setting 'broker_role'"),
        ({"long_polling_enable": "maybe"}, "setting 'long_polling_enable'"),
        ({"default_topic_queue_nums": 2.5}, "setting 'default_topic_queue_nums'"),
        ({"broker_id": 1}, "does not match role ASYNC_MASTER"),
        ({"broker_id": -1}, "broker_id must be >= 0"),
        ({"gil_switch_interval_us": 10}, "gil_switch_interval_us must be 50..100000"),
        ({"answer_slice": -1}, "answer_slice must be 0..4096"),
        ({"max_requests_in_flight_per_connection": 0}, "max_requests_in_flight_per_connection must be >= 1"),
        ({"max_held_pulls_per_connection": 0}, "max_held_pulls_per_connection must be >= 1"),
        ({"max_held_pulls": -5}, "max_held_pulls must be >= 1"),
        ({"listen": "nowhere"}, "listen 'nowhere' is not host:port"),
        ({"advertised_port": 70000}, "advertised_port must be 0..65535 \\(0: the bound port\\), not 70000"),
        ({"advertised_port": -1}, "advertised_port must be 0..65535"),
        ({"advertised_port": "proxy"}, "setting 'advertised_port'"),
        ({"ha_advertised": "10912"}, "ha_advertised '10912' is not host:port"),
        ({"ha_advertised": "host:"}, "ha_advertised 'host:' is not host:port"),
        ({"ha_advertised": "host:0"}, "ha_advertised 'host:0' is not host:port \\(a port 1..65535\\)"),
        ({"ha_advertised": "host:65536"}, "ha_advertised 'host:65536' is not host:port"),
        ({"ha_min_in_sync": 3}, "ha_min_in_sync must be 1 \\(a master may acknowledge alone\\) or 2"),
        ({"ha_in_sync_timeout_ms": 0}, "ha_in_sync_timeout_ms must be within 1..600000"),
        (
            {
                "failover_enabled": True,
                "control_plane_url": "http://cp",
                "broker_credentials_file": "/c",
                "ha_master_address": "127.0.0.1:10912",
            },
            "ha_master_address is for a fixed master: with failover_enabled the control plane names it",
        ),
        ({"namesrv_addrs": "host-without-port"}, "name server address 'host-without-port'"),
        ({"default_topic_queue_nums": 0}, "default_topic_queue_nums must be within"),
        ({"broker_name": "bad name"}, "broker_name 'bad name' is not a valid name"),
        ({"store": {"bogus_key": 1, "other_bogus": 2}}, "unknown \\[store\\] keys: bogus_key, other_bogus"),
        ({"store": {"flush_disk_type": "SOMETIMES"}}, "\\[store\\]"),
        ({"store": {"commit_log_file_size_bytes": 100}}, "commit_log_file_size_bytes"),
        ({"store": {"index_hash_slots": "many"}}, "\\[store\\]"),
    ],
)
def test_config_errors_say_what_is_wrong(overrides: dict[str, object], says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        load(overrides=overrides)


def test_config_file_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load(str(tmp_path / "missing.toml"))
    bad = tmp_path / "bad.toml"
    bad.write_text("broker_name = \n")
    with pytest.raises(ConfigError, match="is not valid TOML"):
        load(str(bad))
    unknown = tmp_path / "unknown.toml"
    unknown.write_text("[store]\nfile_size = 1\n")
    with pytest.raises(ConfigError, match="unknown \\[store\\] keys: file_size"):
        load(str(unknown))
    not_table = tmp_path / "nt.toml"
    not_table.write_text('store = "x"\n')
    with pytest.raises(ConfigError, match="must be a table"):
        load(str(not_table))


# --- the send path's pre-formatted answer ------------------------------------------------------------
def test_the_preformatted_send_ok_header_is_the_header_the_codec_would_write() -> None:
    import orjson

    from data_plane.remoting.codes import FLAG_RESPONSE
    from data_plane.remoting.command import RemotingCommand, decode_frame, encode_bytes, encode_header
    from data_plane.remoting.send_frame import SEND_OK_HEADER as _SEND_OK_HEADER

    msg_id = "7F00000100002A9F00000000000004D2"
    ext = {
        "msgId": msg_id,
        "queueId": "3",
        "queueOffset": "1234567",
        "MSG_REGION": "DefaultRegion",
        "TRACE_ON": "true",
    }
    generic = RemotingCommand(0, opaque=2**31 - 1, flag=FLAG_RESPONSE, ext_fields=ext, language="JAVA", version=399)
    fast = RemotingCommand(0, opaque=2**31 - 1, flag=FLAG_RESPONSE, language="JAVA", version=399)
    # the message id as the template takes it: the store host's hex, then the CommitLog offset
    fast.raw_header = _SEND_OK_HEADER % (399, 2**31 - 1, b"7F00000100002A9F", 0x4D2, 3, 1234567)
    assert orjson.loads(encode_header(fast)) == orjson.loads(encode_header(generic))
    back = decode_frame(memoryview(encode_bytes(fast))[4:])
    assert (back.code, back.opaque, back.flag, back.version) == (0, 2**31 - 1, FLAG_RESPONSE, 399)
    assert back.ext_fields == ext
