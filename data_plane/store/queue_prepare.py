"""QueuePreparer: makes a new topic's ConsumeQueues before its first messages need them.

A ConsumeQueue is made when its first unit is written: a directory, a file created, sized,
mapped and its first block reserved — ~0.3 ms, nearly all of it in the file system (creating a
directory and a file on ext4 took 0.2 and 0.1 ms on a 2-core virtual machine with ext4 on SSD). On the writer's thread
that is the event loop's time: the first sends to a topic of 1,000 queues stalled it for 0.3 s,
and to 10 such topics for seconds at a time, long enough for the producers' 3 s timeouts.

When a topic is created or gets more queues, the broker asks the store to prepare them
(``MessageStore.prepare_queues``); this thread creates each new queue's directory and sized
first file (``ConsumeQueueTable.prepare``) and nothing else: no object, mapping or descriptor
for a queue nobody writes (a broker maps only the queues it has written, as before, also after a
restart). Its system calls release the GIL, so the loop thread keeps serving meanwhile, and the
first write to a prepared queue only maps a file that exists. A write that comes first makes its
queue itself, as before; the preparer writes no data, so the two never lose a unit between them.
``ready(topic)`` is a future done once every queue asked for of that topic is made: the broker
answers a topic's creation then (or after a few seconds), so producers that create a topic and
then send find its queues made. At most ``MAX_PENDING`` queues wait: preparing is only ahead of
need, so a request past that is dropped (those queues are made on their first write).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import threading
from collections import deque

from data_plane.store.dispatcher import ConsumeQueueTable
from data_plane.store.service import ServiceThread

log = logging.getLogger(__name__)

MAX_PENDING = 1_000_000
IDLE_WAIT_S = 5.0


class QueuePreparer(ServiceThread):
    name = "orbit-queue-prepare"
    background = True  # a lower priority (service.py)

    def __init__(self, table: ConsumeQueueTable, *, max_pending: int = MAX_PENDING) -> None:
        super().__init__()
        self._table = table
        self._max_pending = max_pending
        self._pending: deque[tuple[str, range]] = deque()
        self._pending_count = 0
        self._lock = threading.Lock()
        self._ready: dict[str, concurrent.futures.Future[None]] = {}  # topic → done when made
        self._requests_of: dict[str, int] = {}  # topic → its requests not done yet
        self.prepared = 0  # queues made here (statistics, tests)
        self.dropped = 0  # queues not prepared: too many waiting

    def request(self, topic: str, queue_ids: range) -> bool:
        """Prepare these queues of ``topic`` soon; False (nothing queued) when too many wait."""
        with self._lock:
            if self._pending_count + len(queue_ids) > self._max_pending:
                self.dropped += len(queue_ids)
                return False
            self._pending.append((topic, queue_ids))
            self._pending_count += len(queue_ids)
            self._requests_of[topic] = self._requests_of.get(topic, 0) + 1
            if topic not in self._ready:
                self._ready[topic] = concurrent.futures.Future()
        self._wakeup.set()
        return True

    def ready(self, topic: str) -> concurrent.futures.Future[None] | None:
        """Done once every queue asked for of ``topic`` is made (or could not be); None when
        none is waiting."""
        with self._lock:
            return self._ready.get(topic)

    def _request_done(self, topic: str) -> None:
        with self._lock:
            left = self._requests_of.get(topic, 1) - 1  # (none when stop() cleared them)
            if left:
                self._requests_of[topic] = left
                return
            self._requests_of.pop(topic, None)
            ready = self._ready.pop(topic, None)
        if ready is None:
            return
        with contextlib.suppress(concurrent.futures.InvalidStateError):  # (cancelled by a waiter)
            ready.set_result(None)

    def stop(self) -> None:
        super().stop()
        with self._lock:  # nobody waits for what will not be made now
            ready = list(self._ready.values())
            self._ready.clear()
            self._requests_of.clear()
            self._pending.clear()
            self._pending_count = 0
        for f in ready:
            with contextlib.suppress(concurrent.futures.InvalidStateError):
                f.set_result(None)

    @property
    def pending(self) -> int:
        return self._pending_count

    def run(self) -> None:
        while self.wait_for_running(IDLE_WAIT_S):
            while not self._stop.is_set():
                with self._lock:
                    if not self._pending:
                        break
                    topic, queue_ids = self._pending.popleft()
                try:
                    self._prepare(topic, queue_ids)
                finally:
                    self._request_done(topic)

    def _prepare(self, topic: str, queue_ids: range) -> None:
        for n, queue_id in enumerate(queue_ids):
            if self._stop.is_set():
                return
            try:
                if self._table.prepare(topic, queue_id):
                    self.prepared += 1
            except OSError as e:  # a full disk: the first write will say so, as it always has
                log.warning("preparing the queues of %s stopped at %d: %s", topic, queue_id, e)
                with self._lock:
                    self._pending_count -= len(queue_ids) - n
                return
            with self._lock:
                self._pending_count -= 1
