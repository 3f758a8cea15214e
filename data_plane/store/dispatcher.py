"""Dispatcher: turns CommitLog records into ConsumeQueue units and IndexFile entries.

Two ways in, one way out:

* on a master, ``CommitLog.append`` hands the ``DispatchRequest`` of every record it wrote
  straight to ``dispatch`` (under the append lock, right after the bytes are in the log);
* on recovery and on a slave, ``redispatch`` walks the log itself (``CommitLog.scan``) and feeds
  the same requests to ``dispatch``.

Either way a ConsumeQueue unit is written only after its record is in the log, so a reader never
sees a unit whose record is not there. ``dispatched_offset`` is the log offset below which
everything has been dispatched.
"""

from __future__ import annotations

import heapq
import logging
import os
from collections.abc import Iterable, Iterator
from typing import Any

from data_plane.store.commit_log import CommitLog, DispatchRequest, queue_offset_advances
from data_plane.store.consume_queue import CQ_UNIT_SIZE, ConsumeQueue
from data_plane.store.index_file import IndexService
from data_plane.store.mapped_file import is_data_file_name, offset_to_file_name

log = logging.getLogger(__name__)


class ConsumeQueueTable:
    """Every ConsumeQueue of the store, by (topic, queue id), made on the writer's thread when
    its first unit comes. ``prepare`` makes a new queue's directory and first file on disk ahead
    of that, from another thread (the store's QueuePreparer, when a topic is created), so the
    first write only maps a file that exists. A queue prepared and never written holds no
    object, mapping or descriptor, now or after a restart (``load`` leaves it on disk)."""

    def __init__(self, root: str, units_per_file: int) -> None:
        self.root = root
        self.units_per_file = units_per_file
        self.queues: dict[tuple[str, int], ConsumeQueue] = {}
        os.makedirs(root, exist_ok=True)

    def get(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        return self.queues.get((topic, queue_id))

    def get_or_create(self, topic: str, queue_id: int) -> ConsumeQueue:
        key = (topic, queue_id)
        cq = self.queues.get(key)
        if cq is None:
            cq = ConsumeQueue(self.root, topic, queue_id, self.units_per_file)
            self.queues[key] = cq
        return cq

    def prepare(self, topic: str, queue_id: int) -> bool:
        """Create the directory and the sized first file of a queue that has nothing on disk
        yet: ~0.3 ms of ext4 work a queue (``mkdir``, a file's creation), and far longer while
        the file system is busy writing back — off the writer's thread. Only files: no data is
        written (blocks are reserved by the first write), so a writer making the same queue
        meanwhile loses nothing. False when the queue's directory exists already."""
        if (topic, queue_id) in self.queues:
            return False
        topic_dir = os.path.join(self.root, topic)
        os.makedirs(topic_dir, exist_ok=True)
        queue_dir = os.path.join(topic_dir, str(queue_id))
        try:
            os.mkdir(queue_dir)
        except FileExistsError:
            return False  # a write is making it, or it has files already: leave them be
        fd = os.open(os.path.join(queue_dir, offset_to_file_name(0)), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if os.fstat(fd).st_size == 0:  # (a writer that got there first sized it)
                os.ftruncate(fd, self.units_per_file * CQ_UNIT_SIZE)
        finally:
            os.close(fd)
        return True

    def load(self) -> None:
        for topic in sorted(os.listdir(self.root)):
            tdir = os.path.join(self.root, topic)
            if not os.path.isdir(tdir):
                continue
            for qid in sorted(os.listdir(tdir)):
                if not qid.isdigit() or self._never_written(os.path.join(tdir, qid)):
                    continue
                cq = self.get_or_create(topic, int(qid))
                cq.load()

    def _never_written(self, queue_dir: str) -> bool:
        """A queue prepared and never written: nothing but a first file whose first unit is
        zeros (a written queue's first unit points at a record; a queue that starts further on
        fills the head of its first file with hole units, never zeros)."""
        names = [n for n in os.listdir(queue_dir) if is_data_file_name(n)]
        if names != [offset_to_file_name(0)]:
            return False  # (a directory with no file is a queue known to be empty, as ever)
        with open(os.path.join(queue_dir, names[0]), "rb") as f:
            return f.read(CQ_UNIT_SIZE) == bytes(CQ_UNIT_SIZE)

    def topics(self) -> set[str]:
        return {t for t, _ in self.queues}

    def newest_record_start(self, floor: int, count: int) -> int:
        """Where the ``count``-th newest record at or past ``floor`` that took a ConsumeQueue
        unit starts — a record boundary with at least ``count`` records from it to the log's
        end — or ``floor`` when the queues name fewer. A merge of the queues that name records
        past ``floor``, newest first: a few units of each, ``count`` in all, whatever the size
        of the log."""
        queues = [cq for cq in list(self.queues.values()) if cq.max_physic_offset > floor]
        for n, offset in enumerate(heapq.merge(*(cq.offsets_newest_first(floor) for cq in queues), reverse=True), 1):
            if n >= count:
                return offset
        return floor

    def __iter__(self) -> Iterator[ConsumeQueue]:
        return iter(list(self.queues.values()))

    def close(self) -> None:
        for cq in self:
            cq.close()


class Dispatcher:
    __slots__ = ("dispatched_offset", "index", "queues")

    def __init__(self, queues: ConsumeQueueTable, index: IndexService | None) -> None:
        self.queues = queues
        self.index = index
        self.dispatched_offset = 0

    def dispatch(self, requests: Iterable[DispatchRequest]) -> None:
        queues = self.queues.queues
        index = self.index
        end = -1
        for req in requests:
            if queue_offset_advances(req.sys_flag):
                cq = queues.get((req.topic, req.queue_id))
                if cq is None:
                    cq = self.queues.get_or_create(req.topic, req.queue_id)
                cq.put(req.commit_log_offset, req.size, req.tags_code, req.queue_offset)
            if index is not None:
                index.build(req)
            end = req.commit_log_offset + req.size
        self.dispatched_offset = max(self.dispatched_offset, end)

    def targets(self, topic: str, queue_id: int, first_queue_offset: int) -> tuple[Any, ...]:
        """Where ``fastpath.write_batch`` may write units and index entries directly."""
        cq = self.queues.queues.get((topic, queue_id))
        if cq is not None:
            cq.sync_units()  # (units the appender kept pending go before the batch's)
        mf = cq.last_file if cq is not None else None
        if mf is None or mf.file_from_offset + mf.wrote_position != first_queue_offset * CQ_UNIT_SIZE:
            cq_args: tuple[Any, ...] = (None, 0, 0)
        else:
            cq_args = (mf.mv, mf.wrote_position, min(mf.reserved_upto, mf.file_size))
        index = self.index
        if index is None or not index.files:
            return cq_args
        f = index.files[-1]
        return (*cq_args, f.mf.mv, index.hash_slots, f.index_count, f.reserved_entries(), f.begin_timestamp)

    def dispatch_appended(
        self,
        topic: str,
        queue_id: int,
        cq_out: bytes | int,
        first_queue_offset: int,
        index_out: bytes | int,
        last_indexed: int,
        store_timestamp: int,
        end_offset: int,
    ) -> None:
        """Finish indexing a batch just appended by ``CommitLog.append``: record where the
        direct writes ended, or write what could not be written directly."""
        cq = self.queues.queues.get((topic, queue_id))
        if type(cq_out) is int:
            assert cq is not None
            assert cq.last_file is not None
            mf = cq.last_file
            mf.wrote_position = mf.committed_position = cq_out
            cq.max_physic_offset = end_offset
        elif cq_out:
            if cq is None:
                cq = self.queues.get_or_create(topic, queue_id)
            cq.put_units(cq_out, first_queue_offset, end_offset)  # type: ignore[arg-type]
        if type(index_out) is int:
            assert self.index is not None
            f = self.index.files[-1]
            f.index_count = index_out
            f.end_phy_offset = last_indexed
            f.end_timestamp = store_timestamp
        elif index_out and self.index is not None:
            self.index.put_items(index_out, store_timestamp)  # type: ignore[arg-type]
        self.dispatched_offset = end_offset

    def redispatch(self, commit_log: CommitLog, start_offset: int, *, check_crc: bool = True) -> int:
        """Dispatch every sound record from ``start_offset``; returns where the valid log ends.
        Units already present are left as they are (``ConsumeQueue.put`` skips them)."""
        end = start_offset
        batch: list[DispatchRequest] = []
        for item in commit_log.scan(start_offset, check_crc=check_crc):
            end, req = item
            if req is not None:
                batch.append(req)
                if len(batch) >= 1024:
                    self.dispatch(batch)
                    batch = []
        if batch:
            self.dispatch(batch)
        self.dispatched_offset = max(self.dispatched_offset, end)
        return end
