"""control_plane/verified_secrets.py: a burst of logins with one secret costs one scrypt check."""

from __future__ import annotations

import asyncio

import pytest

from control_plane.secret_hash import hash_secret
from control_plane.verified_secrets import VerifiedSecrets

pytestmark = [pytest.mark.unit, pytest.mark.asyncio]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_concurrent_logins_share_one_check_and_later_ones_none() -> None:
    stored = hash_secret("right", log2_n=10)
    v = VerifiedSecrets()
    assert await asyncio.gather(*(v.check("right", stored) for _ in range(50))) == [True] * 50
    assert v.computed == 1
    assert await v.check("right", stored)
    assert v.computed == 1


async def test_a_wrong_secret_is_checked_every_time_and_never_remembered() -> None:
    stored = hash_secret("right", log2_n=10)
    v = VerifiedSecrets()
    assert not await v.check("wrong", stored)
    assert not await v.check("wrong", stored)
    assert v.computed == 2
    assert await v.check("right", stored)


async def test_a_rotated_secret_or_an_expired_entry_is_checked_again() -> None:
    clock = Clock()
    v = VerifiedSecrets(ttl_s=10, clock_s=clock)
    old = hash_secret("s1", log2_n=10)
    assert await v.check("s1", old)
    new = hash_secret("s2", log2_n=10)  # the credential's secret rotated: a new stored hash
    assert not await v.check("s1", new)
    assert v.computed == 2
    clock.now += 11
    assert await v.check("s1", old)
    assert v.computed == 3


async def test_the_memory_is_bounded() -> None:
    v = VerifiedSecrets(max_entries=3)
    stored = [hash_secret(f"s{i}", log2_n=10) for i in range(5)]
    for i, h in enumerate(stored):
        assert await v.check(f"s{i}", h)
    assert len(v._matched) == 3
    assert await v.check("s0", stored[0])  # dropped first: checked again
    assert v.computed == 6
