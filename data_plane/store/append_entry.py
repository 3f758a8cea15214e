"""The store's append entry points: ``MessageStore.entry``, the object the broker, the store's
own ``put_messages`` and the benchmarks append through.

    store.entry ─┬─ _speedups.StoreEntry   the compiled Appender is in use: one C call an append
                 └─ PythonAppendEntry      otherwise: MessageStore.append / append_plain

``MessageStore.start`` chooses it (``_install_entry``), a new one on each start; callers look
``store.entry.append`` / ``store.entry.append_plain`` up after the store has started. Both
answer exactly what ``MessageStore.append`` and ``append_plain`` (the reference) answer. Each
holds its store weakly (the store holds its entry: no reference cycle) and counts what it
stored itself (``count``, ``bytes``), which ``MessageStore.put_count`` / ``put_bytes`` add to
the counts of the store's Python paths.
"""

from __future__ import annotations

import builtins
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from data_plane.store._speedups import Appended
    from data_plane.store.message import Message
    from data_plane.store.message_store import MessageStore
    from data_plane.store.status import PutMessageResult


class AppendEntry(Protocol):
    """``MessageStore.append`` and ``append_plain`` (see them for the arguments and answers),
    and what these entry points counted: messages (``count``) and CommitLog bytes (``bytes``)
    stored that the store's Python paths did not count."""

    def append(self, msgs: Sequence[Message], /) -> tuple[PutMessageResult, int]: ...

    def append_plain(
        self,
        topic: str,
        queue_id: int,
        body: builtins.bytes | bytearray | memoryview,
        properties: str | builtins.bytes,
        flag: int,
        sys_flag: int,
        born_timestamp: int,
        born_host: builtins.bytes,
        reconsume_times: int,
        skip_names: tuple[builtins.bytes, ...],
        /,
    ) -> Appended | PutMessageResult | None: ...

    @property
    def count(self) -> int: ...

    @property
    def bytes(self) -> int: ...


class PythonAppendEntry:
    """The entry points without the compiled Appender (not built, ``ORBIT_PURE_PYTHON``, or
    ``fastpath.use_compiled(False)`` at the store's start), and of a store not started yet: the
    store's own ``append`` and ``append_plain`` (``append_plain`` answers None: not taken).
    Those count in the store's ``_put_count`` / ``_put_bytes``, so ``count`` and ``bytes`` stay
    0."""

    __slots__ = ("_store",)

    def __init__(self, store: MessageStore) -> None:
        self._store = weakref.ref(store)

    def _live(self) -> MessageStore:
        store = self._store()
        if store is None:
            raise RuntimeError("the store of these entry points is gone")
        return store

    def append(self, msgs: Sequence[Message], /) -> tuple[PutMessageResult, int]:
        return self._live().append(msgs)

    def append_plain(
        self,
        topic: str,
        queue_id: int,
        body: builtins.bytes | bytearray | memoryview,
        properties: str | builtins.bytes,
        flag: int,
        sys_flag: int,
        born_timestamp: int,
        born_host: builtins.bytes,
        reconsume_times: int,
        skip_names: tuple[builtins.bytes, ...],
        /,
    ) -> Appended | PutMessageResult | None:
        return self._live().append_plain(
            topic, queue_id, body, properties, flag, sys_flag, born_timestamp, born_host, reconsume_times, skip_names
        )

    @property
    def count(self) -> int:
        return 0

    @property
    def bytes(self) -> int:
        return 0
