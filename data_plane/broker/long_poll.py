"""PullRequestHoldService: pulls that found nothing wait here for new messages (long polling).

A held pull waits on its queue until a message it can use arrives (the queue's max offset
passes the pull's offset and the message's tag hash is one the pull asked for) or until its
suspend time runs out; either way its ``wake`` is called with the pull's own ``payload`` and
whether a message came, and the pull is read again and answered there. Arrivals are announced by
the send path (``notify``) right after the append, so the wake-up costs one dict lookup per send
and no polling; the wakes run together soon after (one callback for all the pulls woken since),
so a read that stored several messages wakes each pull once, after all of them. A pull held for a
connection that closes is let go at once (``release_owner``): it would otherwise wait out its
suspend time for nobody. At most ``max_held`` pulls wait in all and ``max_per_owner`` for one
connection (a push consumer holds one a queue); past either a pull is answered at once, as if it
had not asked to wait.

A consumer of thousands of queues keeps thousands of pulls held, each for seconds, so what a
held pull costs in objects is what the garbage collector walks: a full collection runs each time
the objects that lived through the young collections have grown by a quarter, and with 10,000
pulls held and woken at 3,000 messages a second that was every second or two, 100-300 ms each
(docs/broker.md, "Held pulls and the garbage collector"). So a held pull is one small object
here and no task, future or timer of its own: the deadlines wait in one queue per suspend time
(in the order held, so by deadline), under one timer set for the earliest.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import deque
from collections.abc import Callable, Collection
from typing import Any

log = logging.getLogger(__name__)

MAX_HELD = 100_000
MAX_HELD_PER_OWNER = 32_768
# Suspend times are rounded up to this: one deadline queue per rounded value, so a client's
# choice of times cannot make more than a few hundred queues for the timer to walk.
DEADLINE_STEP_S = 0.1

# ``wake(payload, woken)``: True when a message arrived, False on the suspend time's end, a
# release of the connection or a shutdown.
Wake = Callable[[Any, bool], object]


class _Held:
    __slots__ = ("deadline", "done", "key", "mine", "offset", "payload", "tags_codes", "wake", "woken")

    def __init__(
        self,
        key: tuple[str, int],
        offset: int,
        tags_codes: Collection[int] | None,
        wake: Wake,
        payload: Any,
        deadline: float,
        mine: set[_Held] | None,
    ) -> None:
        self.key = key
        self.offset = offset
        self.tags_codes = tags_codes
        self.wake = wake
        self.payload = payload
        self.deadline = deadline
        self.mine = mine  # its owner's set of held pulls
        self.done = False
        self.woken = False


class PullRequestHoldService:
    def __init__(self, max_held: int = MAX_HELD, max_per_owner: int = MAX_HELD_PER_OWNER) -> None:
        self.max_held = max_held
        self.max_per_owner = max_per_owner
        self.held: dict[tuple[str, int], list[_Held]] = {}
        self.count = 0  # pulls held now
        # Told of every notify (the POP lease book wakes its waiting receivers): (topic, queue id).
        self.on_notify: Callable[[str, int], None] | None = None
        self._by_owner: dict[int, set[_Held]] = {}  # id(owner) → its pulls still held
        # Per suspend time (in DEADLINE_STEP_S): the pulls in the order held (so by deadline),
        # the done ones left in place until they reach the front or a compaction drops them.
        self._deadlines: dict[int, deque[_Held]] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._due: list[_Held] = []  # settled, their wakes not called yet
        self._loop: asyncio.AbstractEventLoop | None = None

    def hold(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        timeout_s: float,
        tags_codes: Collection[int] | None,
        wake: Wake,
        payload: Any = None,
        owner: object | None = None,
    ) -> bool:
        """Hold a pull: ``wake(payload, True)`` on a matching arrival, ``wake(payload, False)``
        after ``timeout_s`` (rounded up to ``DEADLINE_STEP_S``) or when ``owner`` (the pull's
        connection) is released. False, with
        nothing held, when too many pulls are held already, in all or for ``owner``: answer the
        pull at once."""
        if self.count >= self.max_held:
            return False
        mine = None
        if owner is not None:
            mine = self._by_owner.get(id(owner))
            if mine is None:
                mine = self._by_owner[id(owner)] = set()
            elif len(mine) >= self.max_per_owner:
                return False
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        key = (topic, queue_id)
        step = math.ceil(timeout_s / DEADLINE_STEP_S - 1e-9)
        h = _Held(key, offset, tags_codes, wake, payload, loop.time() + step * DEADLINE_STEP_S, mine)
        lst = self.held.get(key)
        if lst is None:
            self.held[key] = [h]
        else:
            lst.append(h)
        self.count += 1
        if mine is not None:
            mine.add(h)
        waiting = self._deadlines.get(step)
        if waiting is None:
            waiting = self._deadlines[step] = deque()
        elif len(waiting) > 2 * self.count + 64:  # mostly pulls woken before their deadline
            waiting = self._deadlines[step] = deque(w for w in waiting if not w.done)
        waiting.append(h)
        if self._timer is None or h.deadline < self._timer_at:
            self._arm(h.deadline)
        return True

    def notify(self, topic: str, queue_id: int, max_offset: int, tags_code: int | None = None) -> None:
        """Messages up to ``max_offset`` (exclusive) are readable in the queue."""
        if self.on_notify is not None:
            self.on_notify(topic, queue_id)
        key = (topic, queue_id)
        lst = self.held.get(key)
        if not lst:
            return
        keep = []
        for h in lst:
            if max_offset > h.offset and (h.tags_codes is None or tags_code is None or tags_code in h.tags_codes):
                self._settle(h, True)
            else:
                keep.append(h)
        if keep:
            self.held[key] = keep
        else:
            del self.held[key]

    def release_owner(self, owner: object) -> int:
        """Wake the pulls held for ``owner`` now, with False (its connection closed); how many."""
        mine = self._by_owner.pop(id(owner), None)
        if not mine:
            return 0
        held = list(mine)
        for h in held:
            self._unlist(h)
            self._settle(h, False)
        return len(held)

    def release_queues(self, topic: str, from_queue_id: int) -> int:
        """Wake the pulls held on ``topic``'s queues from ``from_queue_id`` up now, with False:
        the topic's readQueueNums shrank, and their consumers learn at their next pull that the
        queues are gone rather than at the end of the suspend time. How many were woken."""
        gone = [key for key in self.held if key[0] == topic and key[1] >= from_queue_id]
        n = 0
        for key in gone:
            for h in self.held.pop(key):
                self._settle(h, False)
                n += 1
        return n

    def wake_all(self) -> None:
        """Wake every held pull now, with False (shutdown)."""
        for lst in list(self.held.values()):
            for h in lst:
                self._settle(h, False)
        self.held.clear()
        self._deadlines.clear()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    # --- internals --------------------------------------------------------------------------------
    def _settle(self, h: _Held, woken: bool) -> None:
        """``h`` is answered now (already out of its queue's list): its wake runs soon."""
        h.done = True
        h.woken = woken
        self.count -= 1
        if h.mine is not None:
            h.mine.discard(h)
        self._due.append(h)
        if len(self._due) == 1:
            assert self._loop is not None
            self._loop.call_soon(self._run_due)

    def _run_due(self) -> None:
        due, self._due = self._due, []
        for h in due:
            # (let go of the payload: a settled entry may wait in its deadline queue a while)
            payload, h.payload = h.payload, None
            try:
                h.wake(payload, h.woken)
            except Exception:  # one pull's failure must not strand the others woken with it
                log.exception("waking a held pull failed")

    def _unlist(self, h: _Held) -> None:
        lst = self.held.get(h.key)
        if lst is not None:
            lst.remove(h)
            if not lst:
                del self.held[h.key]

    def _arm(self, at: float) -> None:
        assert self._loop is not None
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = at
        self._timer = self._loop.call_at(at, self._expire_due)

    def _expire_due(self) -> None:
        """Wake the pulls whose suspend time is over (False); set the timer for the next."""
        self._timer = None
        assert self._loop is not None
        now = self._loop.time()
        earliest = None
        for step, waiting in list(self._deadlines.items()):
            while waiting:
                h = waiting[0]
                if h.done:
                    waiting.popleft()
                    continue
                if h.deadline > now:
                    break
                waiting.popleft()
                self._unlist(h)
                self._settle(h, False)
            if waiting:
                if earliest is None or waiting[0].deadline < earliest:
                    earliest = waiting[0].deadline
            else:
                del self._deadlines[step]
        if earliest is not None:
            self._arm(earliest)
