"""Transactional messages on a real store in tmp_path, without sockets: half messages,
END_TRANSACTION commit / rollback / repeats, the check service's checks, counts and rollback,
the crash window between the real message and its op, and the tenancy check of code 37."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from data_plane.auth import Authorizer, Grant, Principal
from data_plane.auth.request_access import PUBLISH, access_of
from data_plane.broker.consumer_offset import ConsumerOffsetManager
from data_plane.broker.transaction import (
    CID_RMQ_SYS_TRANS,
    PROPERTY_TRANSACTION_CHECK_TIMES,
    PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET,
    RMQ_SYS_TRANS_HALF_TOPIC,
    RMQ_SYS_TRANS_OP_HALF_TOPIC,
    TransactionalMessageService,
    origin_of,
    real_message,
)
from data_plane.broker.transaction_check import TransactionCheckService
from data_plane.remoting.codes import RequestCode, ResponseCode
from data_plane.remoting.command import RemotingCommand
from data_plane.remoting.connection import Connection
from data_plane.store import Message, MessageStore
from data_plane.store.message import (
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_PREPARED_TYPE,
    TRANSACTION_TYPE_MASK,
    StoredMessage,
    decode_record,
)
from tests.conftest import ManualClock, small_config

TOPIC = "orders"
GROUP = "tx-group"
NO_CONN: Connection = None  # type: ignore[assignment]  # END_TRANSACTION does not use its connection


@pytest.fixture
def store(tmp_path: Path, clock: ManualClock) -> Iterator[MessageStore]:
    s = MessageStore(small_config(str(tmp_path / "store")), clock_ms=clock)
    s.start()
    yield s
    s.shutdown()


class Checks:
    """Records the CHECK_TRANSACTION_STATE requests the service would send (``send_check``)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, RemotingCommand]] = []
        self.connected = True

    def __call__(self, group: str, cmd: RemotingCommand) -> bool:
        if self.connected:
            self.sent.append((group, cmd))
        return self.connected


def services(
    store: MessageStore, tmp_path: Path, clock: ManualClock, checks: Checks, **opts: Any
) -> tuple[TransactionalMessageService, TransactionCheckService]:
    svc = TransactionalMessageService(store, clock_ms=clock)
    offsets = ConsumerOffsetManager(str(tmp_path / "consumerOffset.json"))
    offsets.load()
    settings = {"timeout_ms": 6_000, "check_interval_ms": 30_000, "check_max": 3, "scan_interval_ms": 100}
    settings.update(opts)
    check = TransactionCheckService(svc, offsets, send_check=checks, clock_ms=clock, **settings)
    check.load()
    return svc, check


def send_half(store: MessageStore, svc: TransactionalMessageService, body: bytes, uniq: str) -> StoredMessage:
    msg = Message(TOPIC, body, 2, 0, {"UNIQ_KEY": uniq, "TRAN_MSG": "true", "TAGS": "t"}, TRANSACTION_PREPARED_TYPE)
    assert svc.prepare([msg], {"a": GROUP}) is None
    result, _end = store.append([msg])
    assert result.append is not None
    half = store.look_message_by_offset(result.append.wrote_offset)
    assert half is not None
    return half


def end(svc: TransactionalMessageService, half: StoredMessage, kind: int, group: str = GROUP) -> RemotingCommand:
    ext = {
        "producerGroup": group,
        "tranStateTableOffset": str(half.queue_offset),
        "commitLogOffset": str(half.commit_log_offset),
        "commitOrRollback": str(kind),
        "fromTransactionCheck": "false",
        "msgId": half.properties["UNIQ_KEY"],
        "transactionId": half.properties["UNIQ_KEY"],
    }
    r = svc.end_transaction(NO_CONN, RemotingCommand(RequestCode.END_TRANSACTION, ext_fields=ext))
    assert isinstance(r, RemotingCommand)
    return r


def messages(store: MessageStore, topic: str, queue_id: int = 0) -> list[StoredMessage]:
    r = store.get_message(topic, queue_id, 0, 1000)
    return [decode_record(m) for m in r.messages]


def test_a_half_message_lands_in_the_half_topic_invisible_on_its_real_queue(
    store: MessageStore, tmp_path: Path
) -> None:
    svc = TransactionalMessageService(store)
    half = send_half(store, svc, b"pay 42", "U1")
    assert half.topic == RMQ_SYS_TRANS_HALF_TOPIC
    assert half.queue_id == 0
    assert half.properties["REAL_TOPIC"] == TOPIC
    assert half.properties["REAL_QID"] == "2"
    assert half.properties["PGROUP"] == GROUP
    assert half.sys_flag & TRANSACTION_TYPE_MASK == 0
    assert store.max_offset_in_queue(TOPIC, 2) == 0


def test_commit_puts_the_real_message_then_an_op_and_a_repeat_changes_nothing(
    store: MessageStore, tmp_path: Path
) -> None:
    svc = TransactionalMessageService(store)
    half = send_half(store, svc, b"pay 42", "U1")
    assert end(svc, half, 8).code == ResponseCode.SUCCESS
    assert end(svc, half, 8).code == ResponseCode.SUCCESS  # the producer's answer racing a check's
    assert end(svc, half, 12).code == ResponseCode.SUCCESS  # too late to roll back: still committed once
    [real] = messages(store, TOPIC, 2)
    assert real.body == b"pay 42"
    assert real.sys_flag & TRANSACTION_TYPE_MASK == TRANSACTION_COMMIT_TYPE
    assert real.properties["TRAN_MSG"] == "true"
    assert "REAL_TOPIC" not in real.properties
    assert real.properties[PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET] == str(half.queue_offset)
    assert real.prepared_transaction_offset == half.commit_log_offset
    ops = messages(store, RMQ_SYS_TRANS_OP_HALF_TOPIC)
    assert ops[0].body == str(half.queue_offset).encode()
    assert ops[0].tags == "d"


def test_rollback_writes_only_an_op(store: MessageStore) -> None:
    svc = TransactionalMessageService(store)
    half = send_half(store, svc, b"x", "U2")
    assert end(svc, half, 12).code == ResponseCode.SUCCESS
    assert end(svc, half, 8).code == ResponseCode.SUCCESS  # ended already: no commit now
    assert store.max_offset_in_queue(TOPIC, 2) == 0
    assert len(messages(store, RMQ_SYS_TRANS_OP_HALF_TOPIC)) == 1


def test_end_transaction_refuses_a_wrong_group_offset_or_kind(store: MessageStore) -> None:
    svc = TransactionalMessageService(store)
    half = send_half(store, svc, b"x", "U3")
    assert end(svc, half, 8, group="other").remark == "the producer group wrong"
    assert end(svc, half, 9).code == ResponseCode.SYSTEM_ERROR
    wrong = dataclasses.replace(half, queue_offset=half.queue_offset + 1)
    assert end(svc, wrong, 8).remark == "the transaction state table offset wrong"
    assert store.max_offset_in_queue(TOPIC, 2) == 0


def test_an_unresolved_half_is_checked_with_a_counted_copy_then_rolled_back(
    store: MessageStore, tmp_path: Path, clock: ManualClock
) -> None:
    checks = Checks()
    svc, check = services(store, tmp_path, clock, checks, timeout_ms=1_000, check_interval_ms=5_000, check_max=2)
    half = send_half(store, svc, b"x", "U4")
    check.tick()
    assert checks.sent == []  # younger than the timeout
    clock.advance(1_001)
    check.tick()
    [(group, cmd)] = checks.sent
    assert group == GROUP
    assert cmd.code == RequestCode.CHECK_TRANSACTION_STATE
    copy = decode_record(cmd.body_bytes())  # the message on its real topic and queue
    assert copy.topic == TOPIC
    assert copy.queue_id == 2
    assert copy.body == b"x"
    assert copy.properties[PROPERTY_TRANSACTION_CHECK_TIMES] == "1"
    assert cmd.ext_fields is not None
    assert cmd.ext_fields["transactionId"] == "U4"
    assert int(cmd.ext_fields["tranStateTableOffset"]) == half.queue_offset + 1  # the copy's offsets
    # Two checks at most; the next interval ends in a rollback.
    for n in (2, 3):
        clock.advance(4_000)
        check.tick()
        assert len(checks.sent) == n - 1
        clock.advance(1_001)
        check.tick()
    assert len(checks.sent) == 2
    assert check.stats["rolled_back"] == 1
    assert store.max_offset_in_queue(TOPIC, 2) == 0
    assert check.pending == {}
    assert check.progress == store.max_offset_in_queue(RMQ_SYS_TRANS_HALF_TOPIC, 0)


def test_the_checkers_commit_of_a_copy_delivers_once_even_if_the_original_is_ended_too(
    store: MessageStore, tmp_path: Path, clock: ManualClock
) -> None:
    checks = Checks()
    svc, check = services(store, tmp_path, clock, checks, timeout_ms=1_000)
    half = send_half(store, svc, b"x", "U5")
    clock.advance(1_001)
    check.tick()
    copy_offset = int((checks.sent[0][1].ext_fields or {})["commitLogOffset"])
    copy = store.look_message_by_offset(copy_offset)
    assert copy is not None
    assert origin_of(copy) == half.queue_offset
    assert end(svc, copy, 8).code == ResponseCode.SUCCESS
    assert end(svc, half, 8).code == ResponseCode.SUCCESS  # the producer's late answer about the original
    assert len(messages(store, TOPIC, 2)) == 1
    clock.advance(60_000)
    check.tick()
    assert check.pending == {}
    assert len(checks.sent) == 1


def test_a_commit_whose_op_was_lost_in_a_crash_gets_its_op_not_a_second_message(
    store: MessageStore, tmp_path: Path, clock: ManualClock
) -> None:
    checks = Checks()
    svc, _check = services(store, tmp_path, clock, checks, timeout_ms=1_000)
    half = send_half(store, svc, b"x", "U6")
    # The crash window: the real message was written, the process died before its op.
    store.append([real_message(half, origin_of(half))])
    # A new process: boot_log_end is past both records.
    svc2, check2 = services(store, tmp_path, clock, checks, timeout_ms=1_000)
    clock.advance(1_001)
    check2.tick()
    assert checks.sent == []  # nobody asked: the index lookup found the commit
    assert len(messages(store, TOPIC, 2)) == 1
    assert [m.body for m in messages(store, RMQ_SYS_TRANS_OP_HALF_TOPIC)] == [str(half.queue_offset).encode()]
    assert svc2.state.stats["repaired"] == 1
    assert end(svc2, half, 8).code == ResponseCode.SUCCESS  # and a late commit changes nothing
    assert len(messages(store, TOPIC, 2)) == 1


def test_progress_and_resolved_halves_survive_a_restart(
    store: MessageStore, tmp_path: Path, clock: ManualClock
) -> None:
    checks = Checks()
    svc, check = services(store, tmp_path, clock, checks, timeout_ms=1_000)
    a = send_half(store, svc, b"a", "UA")
    b = send_half(store, svc, b"b", "UB")
    end(svc, b, 12)
    check.tick()
    assert check.progress == a.queue_offset  # a is still open
    check.offsets.persist()
    # Restart: b stays resolved (from the op log), a is checked once it is due.
    checks2 = Checks()
    _svc2, check2 = services(store, tmp_path, clock, checks2, timeout_ms=1_000)
    assert b.queue_offset in check2.state.removed
    assert check2.progress == a.queue_offset
    clock.advance(1_001)
    check2.tick()
    assert [decode_record(c.body_bytes()).body for _g, c in checks2.sent] == [b"a"]
    offsets = check2.offsets
    assert offsets.query(CID_RMQ_SYS_TRANS, RMQ_SYS_TRANS_HALF_TOPIC, 0) == check2.progress > b.queue_offset


def test_a_check_without_a_connected_producer_still_counts(
    store: MessageStore, tmp_path: Path, clock: ManualClock
) -> None:
    checks = Checks()
    checks.connected = False
    svc, check = services(store, tmp_path, clock, checks, timeout_ms=1_000, check_max=1)
    send_half(store, svc, b"x", "U7")
    clock.advance(1_001)
    check.tick()
    assert check.stats["checks_unsent"] == 1
    clock.advance(30_001)
    check.tick()
    assert check.stats["rolled_back"] == 1


# --- tenancy: END_TRANSACTION is a deferred publish on the half's real topic -------------------------
def _tenant(name: str, grants: list[Grant]) -> Principal:
    return Principal.build(subject=f"{name}-ak", tenant=name, role="tenant", grants=grants, source="access_key")


def test_end_transaction_is_a_deferred_publish_on_the_stored_real_topic() -> None:
    cmd = RemotingCommand(RequestCode.END_TRANSACTION, ext_fields={"producerGroup": "acme%pg"})
    access = access_of(cmd)
    assert access.deferred == PUBLISH
    auth = Authorizer(enabled=True, deferred_checks=True)
    acme = _tenant("acme", [Grant("topic", "orders", ["publish"])])
    reader = _tenant("acme", [Grant("topic", "orders", ["subscribe"])])
    assert auth.authorize(acme, cmd) is None
    assert auth.authorize_stored_topic(acme, "acme%orders", PUBLISH) is None
    assert auth.authorize_stored_topic(acme, "other%orders", PUBLISH) is not None
    assert auth.authorize_stored_topic(reader, "acme%orders", PUBLISH) is not None
    other_group = RemotingCommand(RequestCode.END_TRANSACTION, ext_fields={"producerGroup": "other%pg"})
    assert auth.authorize(acme, other_group) is not None
    assert Authorizer(enabled=True).authorize(acme, cmd) is not None  # deferred checks off: refused


def test_a_refused_stored_topic_check_answers_not_found(store: MessageStore) -> None:
    seen: list[str] = []

    def stored_topic_check(cmd: RemotingCommand, topic: str) -> bool:
        seen.append(topic)
        return False

    svc = TransactionalMessageService(store, stored_topic_check=stored_topic_check)
    half = send_half(store, svc, b"x", "U8")
    r = end(svc, half, 8)
    assert r.code == ResponseCode.SYSTEM_ERROR
    assert r.remark == "find prepared transaction message failed"
    assert seen == [TOPIC]
    assert store.max_offset_in_queue(TOPIC, 2) == 0
