"""``data_plane.proxy.answers``: the SendMessageResponse and AckMessageResponse written by hand
are the bytes protobuf writes for the same answers, and read back as them."""

from __future__ import annotations

import random

from data_plane.proxy.answers import ack_ok, send_ok
from data_plane.proxy.v2 import definition_pb2 as pb
from data_plane.proxy.v2 import service_pb2 as rpc


def _by_protobuf(entries: list[tuple[str, int]]) -> bytes:
    ok = pb.Status(code=pb.OK, message="OK")
    return rpc.SendMessageResponse(
        status=ok, entries=[rpc.SendResultEntry(status=ok, message_id=m, offset=o) for m, o in entries]
    ).SerializeToString()


def test_an_all_ok_send_answer_is_the_bytes_protobuf_writes() -> None:
    seed = random.randrange(1 << 32)
    print("seed", seed)
    rng = random.Random(seed)
    assert send_ok([("", 0), ("X", 0)]) == _by_protobuf([("", 0), ("X", 0)])
    for n in (1, 2, 32, 64):
        entries = [
            (f"{rng.getrandbits(64):016X}{i:016X}", rng.choice((0, 1, 127, 128, 1 << 40, rng.getrandbits(62))))
            for i in range(n)
        ]
        assert send_ok(entries) == _by_protobuf(entries)


def test_an_all_ok_send_answer_reads_back_with_its_ids_and_offsets() -> None:
    entries = [("A" * 200, 0), ("B", 300), ("", 5)]
    got = rpc.SendMessageResponse.FromString(send_ok(entries))
    assert (got.status.code, got.status.message) == (pb.OK, "OK")
    assert [(e.message_id, e.offset, e.status.code) for e in got.entries] == [(m, o, pb.OK) for m, o in entries]


def test_an_all_ok_ack_answer_is_the_bytes_protobuf_writes() -> None:
    seed = random.randrange(1 << 32)
    print("seed", seed)
    rng = random.Random(seed)
    ok = pb.Status(code=pb.OK, message="OK")
    for n in (1, 2, 32, 200):
        entries = [
            (
                rng.choice(["", f"{rng.getrandbits(64):016X}", "é" * 70]),
                rng.choice(["", f"{i}:{rng.getrandbits(40)}:{rng.getrandbits(64):016x}"]),
            )
            for i in range(n)
        ]
        want = rpc.AckMessageResponse(
            status=ok,
            entries=[rpc.AckMessageResultEntry(message_id=m, receipt_handle=h, status=ok) for m, h in entries],
        ).SerializeToString()
        assert ack_ok(entries) == want
