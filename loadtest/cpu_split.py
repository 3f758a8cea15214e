"""One CPU for a noisy tenant's clients, the others for everything else in the run: on a machine
of few cores, a stand-in for clients on hosts of their own (their CPU then takes nothing from the
broker's or the other tenants'), closer than a niceness, which still shares every core."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager


class CpuSplitError(RuntimeError):
    """The run cannot give a tenant a CPU of its own (fewer than two usable CPUs)."""


def split() -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(the noisy tenant's CPU, every other CPU) of those this process may run on."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise CpuSplitError(f"a CPU of its own for one tenant needs 2 usable CPUs; this process has {len(cpus)}")
    return (cpus[-1],), tuple(cpus[:-1])


@contextmanager
def others_on(cpus: tuple[int, ...]) -> Iterator[None]:
    """This process, and every process it starts meanwhile, on ``cpus`` until the block ends."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def pin(cpus: tuple[int, ...]) -> None:
    """This process on ``cpus`` (a worker's first step; () leaves it where it is)."""
    if cpus:
        os.sched_setaffinity(0, cpus)
