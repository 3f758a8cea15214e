"""The store's basic promise end to end: what is put can be pulled, found and survives a restart."""

from __future__ import annotations

from collections.abc import Callable

from data_plane.store import GetMessageStatus, Message, MessageStore, PutMessageStatus
from data_plane.store.message import decode_record


def test_put_then_pull_returns_the_same_bytes_after_a_restart(
    make_store: Callable[..., MessageStore], write_path: str
) -> None:
    store = make_store()
    bodies = [f"message {i:04d} ".encode() * (i % 9 + 20) for i in range(200)]
    for i, body in enumerate(bodies):
        result, _ = store.append([Message(topic="T", body=body, queue_id=i % 3, properties={"KEYS": f"k{i}"})])
        assert result.status is PutMessageStatus.PUT_OK
    assert len(store.commit_log.mfq.files) > 1, "the test must cross a file boundary"
    store.shutdown()
    store.start()
    got: list[tuple[bytes, int]] = []
    for q in range(3):
        offset = 0
        while True:
            r = store.get_message("T", q, offset, 32)
            if r.status is not GetMessageStatus.FOUND:
                break
            got.extend((decode_record(m).body, q) for m in r.messages)
            offset = r.next_begin_offset
    assert sorted(got) == sorted((b, i % 3) for i, b in enumerate(bodies))
    assert [m.body for m in store.query_message("T", "k123")] == [bodies[123]]
