"""The broker's background tasks: how they stop."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable


async def cancel_all(tasks: Iterable[asyncio.Task[None]]) -> None:
    """Cancel every task, then wait for each to finish; a task that already failed does not stop
    the shutdown (its error was logged where it happened)."""
    tasks = list(tasks)
    for t in tasks:
        t.cancel()
    for t in tasks:
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await t
