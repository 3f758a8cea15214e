"""The positions the append path reads and moves on every message, as the base classes of
MappedFile (``FilePositions``) and ConsumeQueue (``QueuePositions``).

Layout (compiled, ``_speedups.c``): after the object header, C ``long long`` fields in this
order::

    FilePositions:  wrote_position, committed_position, file_size,
                    file_from_offset, reserved_upto                     (5 x 8 bytes)
                    the held view's address and length, busy            (8 + 8 + 4 bytes)
                    flushed_position                                    (8 bytes)
                    map: the Py_buffer hold_map keeps of the file's mapping (80 bytes)

(what every append reads or moves first, within the object's first line or two).
    QueuePositions: max_physic_offset, pend_from_qo                     (2 x 8 bytes)
                    pending units: count, room, generation              (3 x 4 bytes)
                    the pending units themselves                        (8 x 20 bytes)

The subclasses' own ``__slots__`` follow. Python code sees plain ``int`` attributes; the
compiled appender reads and writes the fields in place. That matters with thousands of queues:
each append lands on another queue's ConsumeQueue and file objects, and every ``int`` object a
slot pointed at, read there or replaced, was a cache miss of its own.

For the same reason the compiled appender keeps a ConsumeQueue's newest units pending in the
queue object and writes them to its file up to eight at a time (``sync_units``, which every
ConsumeQueue method calls first): writing each unit to another queue's file page cost a TLB and
a cache miss per append.

Without the compiled module (or with ``ORBIT_PURE_PYTHON`` set), the twins below, ordinary
``__slots__`` classes with the same attributes, serve.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from data_plane.store.compiled import speedups


class PyFilePositions:
    """A mapped file's positions in bytes (the pure-Python twin)."""

    __slots__ = (
        "committed_position",
        "file_from_offset",
        "file_size",
        "flushed_position",
        "reserved_upto",
        "wrote_position",
    )

    wrote_position: int  # bytes laid out so far
    committed_position: int  # bytes handed to the file so far
    flushed_position: int  # bytes flushed to disk so far
    file_size: int
    file_from_offset: int  # the offset of the file's first byte (its name)
    reserved_upto: int  # bytes with disk blocks reserved

    def hold_map(self, view: memoryview) -> None:
        """Keep a writable view of the file's mapping for the compiled append path; the holder
        calls ``drop_map`` before releasing the mapping. Nothing to keep here."""

    def drop_map(self) -> bool:
        """Let go of what ``hold_map`` kept; False while an append is writing through it (the
        compiled base: its view then keeps the mapping, and ``MappedFile.close`` says "later")."""
        return True


class PyQueuePositions:
    """A ConsumeQueue's log position (the pure-Python twin)."""

    __slots__ = ("max_physic_offset",)

    max_physic_offset: int  # end (offset + size) of the last record indexed; -1 before the first
    pending_units = 0  # the compiled appender's units not yet in the file (none here)

    def sync_units(self) -> None:
        """Write the units the compiled appender keeps pending to the queue's file (the
        compiled base; nothing is ever pending here)."""


def compiled_module() -> Any:
    """``_speedups`` when it is built and in use (``compiled.speedups``): what this module and
    ``mapped_file`` choose their implementations by, once, at import."""
    return speedups()


def _compiled() -> tuple[type, type, type] | None:
    speedups = compiled_module()
    if speedups is None:
        return None
    return speedups.FilePositions, speedups.QueuePositions, speedups.QueueOffsets


if TYPE_CHECKING:
    FilePositions = PyFilePositions
    QueuePositions = PyQueuePositions
    QueueOffsets = dict
else:
    # QueueOffsets: the CommitLog's next queue offset of each (topic, queue id), a mapping of
    # ints. Compiled, its values live in cells that are never replaced nor removed (keys are not
    # deleted), which the appender keeps for the queues it has met: it reads and moves a queue's
    # offset in its cell, and a value Python sets lands in the same cell. The twin is a dict.
    FilePositions, QueuePositions, QueueOffsets = _compiled() or (PyFilePositions, PyQueuePositions, dict)
