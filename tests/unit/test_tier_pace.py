"""An upload's pace (data_plane/store/tier/object_store.py: ``Pace``, ``PacedBody``): the bytes
the HTTP client reads go out no faster than the bandwidth asked for, and all of them go out."""

from __future__ import annotations

import os
import time

from data_plane.store.tier.object_store import Pace, PacedBody


def test_a_pace_holds_its_bandwidth_over_many_takes() -> None:
    pace = Pace(2_000_000)
    began = time.monotonic()
    for _ in range(40):
        pace.take(25_000)  # 1 MB in all: the first take is free, the rest wait their turn
    took = time.monotonic() - began
    assert took >= (1_000_000 - 25_000) / 2_000_000 * 0.98, took


def test_no_limit_never_waits() -> None:
    pace = Pace(0)
    began = time.monotonic()
    for _ in range(1000):
        pace.take(1 << 20)
    assert time.monotonic() - began < 0.5


def test_a_paced_body_gives_every_byte_whatever_the_read_sizes() -> None:
    data = os.urandom(300_000)
    for size in (1, 8192, 65536, 1 << 20, -1, None):
        body = PacedBody(data, Pace(0))
        out = bytearray()
        while chunk := body.read(size):
            out += chunk
            if size in (-1, None):
                break
        assert bytes(out) == data, size


def test_the_http_clients_reads_are_paced_and_a_signers_whole_body_reads_are_not() -> None:
    data = os.urandom(512 * 1024)
    body = PacedBody(data, Pace(1_000_000))
    began = time.monotonic()
    assert body.read(1 << 20) == data  # the signer hashing the payload: not on the wire
    body.seek(0)
    assert time.monotonic() - began < 0.2
    sent = bytearray()
    while chunk := body.read(16384):  # the HTTP client sending it
        sent += chunk
    took = time.monotonic() - began
    assert bytes(sent) == data
    assert took >= (len(data) - 16384) / 1_000_000 * 0.98, took
