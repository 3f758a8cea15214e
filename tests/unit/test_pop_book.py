"""The POP lease book's pieces that need no broker: a queue's window (``next``, leases, done),
receipt handles and recall handles, and what a forged or stale one gets."""

from __future__ import annotations

import base64

import pytest

from data_plane.broker.pop import Lease, PopError, PopQueue, handle_of, parse_handle
from data_plane.broker.recall import RecallBook, parse_recall_handle, recall_handle


def test_next_moves_past_leased_and_done_offsets_and_committed_waits_for_the_oldest_lease() -> None:
    q = PopQueue(next=10)
    q.leases[10] = Lease(deadline_ms=1, attempt=1, seq=1)
    q.done.update({11, 13})
    q.settle()
    assert q.next == 12  # 10 leased, 11 done; 12 was never handed out
    assert q.done == {13}  # only what lies above next is kept
    assert q.committed() == 10  # the lease on 10 holds the group's offset back
    del q.leases[10]
    q.done.add(12)
    q.settle()
    assert (q.next, q.done, q.committed()) == (14, set(), 14)


def test_committed_never_passes_a_message_a_fifo_group_skipped() -> None:
    # offsets 0 and 1 of message group g, 2 of group h: 0 and 2 leased, 1 waits its turn
    q = PopQueue(next=0)
    q.leases[0] = Lease(deadline_ms=1, attempt=1, seq=1, group_key="g")
    q.leases[2] = Lease(deadline_ms=1, attempt=1, seq=2, group_key="h")
    q.settle()
    assert q.next == 1
    del q.leases[0]  # 0 acknowledged: 1 is still to deliver, so the group's offset is 1, not 2
    q.settle()
    assert q.committed() == 1


def test_a_recall_drops_only_the_message_of_its_own_topic() -> None:
    book = RecallBook()
    book.recalled[("acme%orders", "ID1")] = 1
    assert not book.take("evil%own", "ID1")  # another topic naming the same id: nothing
    assert not book.take("acme%orders", None)
    assert book.take("acme%orders", "ID1")
    assert not book.take("acme%orders", "ID1")  # once
    assert book.dropped == 1


def test_receipt_handles_round_trip_and_forgeries_are_refused() -> None:
    h = handle_of(3, 12345, 0xDEADBEEF)
    assert parse_handle(h) == (3, 12345, 0xDEADBEEF)
    for bad in ("", "3:12345", "3:x:00000000deadbeef", "3:1:deadbeef", "-1:1:00000000deadbeef", "9" * 100):
        with pytest.raises(PopError, match="not a receipt handle") as e:
            parse_handle(bad)
        assert e.value.code == "handle"


def test_recall_handles_round_trip_and_others_are_refused() -> None:
    h = recall_handle("acme%orders", "01ABC", 1_800_000_000_000)
    assert parse_recall_handle(h) == ("acme%orders", "01ABC", 1_800_000_000_000)
    junk = [
        "not base64 ***",
        base64.urlsafe_b64encode(b"only-a-topic").decode(),
        base64.urlsafe_b64encode(b"t\nid\nsoon").decode(),
        "A" * 2000,
    ]
    for bad in junk:
        with pytest.raises(ValueError, match=r"recall handle|too long"):
            parse_recall_handle(bad)
