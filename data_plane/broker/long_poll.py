"""PullRequestHoldService: pulls that found nothing wait here for new messages (long polling).

A held pull waits on its queue until a message it can use arrives (the queue's max offset
passes the pull's offset and the message's tag hash is one the pull asked for) or until its
suspend time runs out; either way the pull is then read again and answered. Arrivals are
announced by the send path (``notify``) right after the append, so the wake-up costs one dict
lookup per send and no polling. A pull held for a connection that closes is let go at once
(``release_owner``): it would otherwise wait out its suspend time for nobody. At most
``max_held`` pulls wait in all and ``max_per_owner`` for one connection (a push consumer holds
one a queue); past either a pull is answered at once, as if it had not asked to wait."""

from __future__ import annotations

import asyncio
from collections.abc import Collection

MAX_HELD = 100_000
MAX_HELD_PER_OWNER = 32_768


class _Held:
    __slots__ = ("fut", "key", "offset", "tags_codes", "timer")

    def __init__(
        self, fut: asyncio.Future[bool], key: tuple[str, int], offset: int, tags_codes: Collection[int] | None
    ) -> None:
        self.fut = fut
        self.key = key
        self.offset = offset
        self.tags_codes = tags_codes
        self.timer: asyncio.TimerHandle | None = None


class PullRequestHoldService:
    def __init__(self, max_held: int = MAX_HELD, max_per_owner: int = MAX_HELD_PER_OWNER) -> None:
        self.max_held = max_held
        self.max_per_owner = max_per_owner
        self.held: dict[tuple[str, int], list[_Held]] = {}
        self.count = 0
        self._by_owner: dict[int, set[_Held]] = {}  # id(owner) → its pulls still held

    def hold(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        timeout_s: float,
        tags_codes: Collection[int] | None,
        owner: object | None = None,
    ) -> asyncio.Future[bool] | None:
        """A future resolved with True on a matching arrival, False on timeout or when
        ``owner`` (the pull's connection) is released (or None when too many pulls are held
        already, in all or for ``owner``: answer the pull at once)."""
        if self.count >= self.max_held:
            return None
        mine = None
        if owner is not None:
            mine = self._by_owner.get(id(owner))
            if mine is None:
                mine = self._by_owner[id(owner)] = set()
            elif len(mine) >= self.max_per_owner:
                return None
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[bool] = loop.create_future()
        key = (topic, queue_id)
        h = _Held(fut, key, offset, tags_codes)
        lst = self.held.get(key)
        if lst is None:
            lst = self.held[key] = []
        lst.append(h)
        self.count += 1
        h.timer = loop.call_later(timeout_s, self._expire, h)
        if mine is not None:
            mine.add(h)
            fut.add_done_callback(lambda _f: mine.discard(h))
        return fut

    def release_owner(self, owner: object) -> int:
        """Answer the pulls held for ``owner`` now, with False (its connection closed); how many."""
        mine = self._by_owner.pop(id(owner), None)
        if not mine:
            return 0
        released = 0
        for h in list(mine):
            if h.fut.done():
                continue
            if h.timer is not None:
                h.timer.cancel()
            self._remove(h)
            h.fut.set_result(False)
            released += 1
        return released

    def _remove(self, h: _Held) -> None:
        key = h.key
        lst = self.held.get(key)
        if lst is not None:
            try:
                lst.remove(h)
                self.count -= 1
            except ValueError:
                return
            if not lst:
                del self.held[key]

    def _expire(self, h: _Held) -> None:
        self._remove(h)
        if not h.fut.done():
            h.fut.set_result(False)

    def notify(self, topic: str, queue_id: int, max_offset: int, tags_code: int | None = None) -> None:
        """Messages up to ``max_offset`` (exclusive) are readable in the queue."""
        lst = self.held.get((topic, queue_id))
        if not lst:
            return
        keep = []
        for h in lst:
            if h.fut.done():
                self.count -= 1
                continue
            if max_offset > h.offset and (h.tags_codes is None or tags_code is None or tags_code in h.tags_codes):
                self.count -= 1
                if h.timer is not None:
                    h.timer.cancel()
                h.fut.set_result(True)
            else:
                keep.append(h)
        if keep:
            self.held[(topic, queue_id)] = keep
        else:
            del self.held[(topic, queue_id)]

    def wake_all(self) -> None:
        """Answer every held pull now (shutdown)."""
        for lst in self.held.values():
            for h in lst:
                if h.timer is not None:
                    h.timer.cancel()
                if not h.fut.done():
                    h.fut.set_result(False)
        self.held.clear()
        self._by_owner.clear()
        self.count = 0
