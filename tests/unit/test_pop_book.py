"""The POP lease book's pieces that need no broker: a queue's window (``next``, leases, done),
receipt handles and recall handles, and what a forged or stale one gets."""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING, cast

import pytest

from data_plane.broker.pop import Lease, PopError, PopQueue, PopService, handle_of, parse_handle
from data_plane.broker.recall import RecallBook, parse_recall_handle, recall_handle

if TYPE_CHECKING:
    from data_plane.broker.broker import Broker


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


def test_leases_a_receive_shares_come_back_from_the_journal_each_its_own() -> None:
    book = PopService(cast("Broker", None))  # (replaying records needs no broker)
    # A receive's record: offsets 5-7 leased together (one seq), 9 alone (a redelivery), 8 filtered out.
    shared = [[o, 1000, 1, 0xAB, None] for o in (5, 6, 7)]
    book._apply(["R", "g", "t", 0, 10, [*shared, [9, 2000, 3, 0xCD, None]], [8], False, 5])
    pq = book.queues[("g", "t", 0)]
    first = Lease(1000, 1, 0xAB)
    assert pq.leases == {5: first, 6: first, 7: first, 9: Lease(2000, 3, 0xCD)}
    assert (pq.next, pq.done, pq.committed()) == (10, set(), 5)
    # Changing one lease's deadline leaves the others of its receive as they were.
    book._apply(["C", "g", "t", 0, 6, 5000, 0xEF])
    assert (pq.leases[5], pq.leases[6], pq.leases[7]) == (first, Lease(5000, 1, 0xEF), first)
    book._apply(["A", "g", "t", 0, [5, 7]])
    assert sorted(pq.leases) == [6, 9]
    assert pq.committed() == 6
