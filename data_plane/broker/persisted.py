"""ConfigFile: a JSON document kept on disk atomically (RocketMQ's ConfigManager).

Saving writes ``<name>.tmp``, fsyncs it, keeps the previous file as ``<name>.bak`` and renames
the new one into place, then fsyncs the directory; a crash at any point leaves either the old or
the new document. Loading falls back to ``.bak`` when the main file is missing or unreadable.

Each document saved carries a sequence number taken when it was copied (``next_seq``, on the
event loop): a save that reaches the disk after a newer one — a copy written on a worker thread
that finishes after the shutdown's own save — is dropped, so an older document never replaces
a newer one. ``SaveBehind`` saves on a worker thread after changes, so the two ``fsync``s (tens
of ms while the disk writes back: 91 ms once in the many-queues scenario) are not the event
loop's: the broker's admin requests that create, change or delete a topic or a group wait for it
without holding up every other client. Changes made on the data path (a send's auto-created
topic, a retry or dead-letter topic, a group's first pull) are still saved inline: what a client
was acknowledged must find its topic after a kill -9.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import threading
from collections.abc import Callable
from typing import Any

import orjson

log = logging.getLogger(__name__)


class ConfigFile:
    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()  # saves may come from the loop and from a worker thread
        self._seq = itertools.count(1)
        self._saved_seq = 0  # the newest document's number on disk
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)

    def load(self) -> dict[str, Any] | None:
        for candidate in (self.path, self.path + ".bak"):
            try:
                with open(candidate, "rb") as f:
                    doc = orjson.loads(f.read())
            except FileNotFoundError:
                continue
            except (OSError, orjson.JSONDecodeError) as e:
                log.error("cannot read %s (%s); trying the backup", candidate, e)
                continue
            if isinstance(doc, dict):
                if candidate != self.path:
                    log.warning("restored %s from its backup", self.path)
                return doc
        return None

    def next_seq(self) -> int:
        """The number of a document copied now (take it with the copy, on the loop thread)."""
        return next(self._seq)

    def save(self, doc: dict[str, Any], seq: int | None = None) -> bool:
        """Write ``doc`` (numbered ``seq``, or now); False, writing nothing, when a newer
        document is on disk already."""
        if seq is None:
            seq = self.next_seq()
        data = orjson.dumps(doc, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS)
        with self._lock:
            if seq <= self._saved_seq:
                return False
            self._write(data)
            self._saved_seq = seq
        return True

    def _write(self, data: bytes) -> None:
        tmp = self.path + ".tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        if os.path.exists(self.path):
            with contextlib.suppress(OSError):
                os.replace(self.path, self.path + ".bak")
        os.replace(tmp, self.path)
        dfd = os.open(os.path.dirname(self.path) or ".", os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


class SaveBehind:
    """Saves a ConfigFile's document on a worker thread after changes: ``changed()`` marks it
    and starts one task, which copies the document (``snapshot``, on the loop) and writes it
    until no change is left; ``saved()`` waits until the changes made before it are on disk. A
    save that fails is logged, stays marked, and is tried again by the next ``changed()``."""

    def __init__(self, file: ConfigFile, snapshot: Callable[[], dict[str, Any]], what: str) -> None:
        self.file = file
        self._snapshot = snapshot
        self.what = what
        self.dirty = False
        self.error: OSError | None = None  # the last save's, while it is not saved since
        self._task: asyncio.Task[None] | None = None

    def changed(self) -> None:
        self.dirty = True
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while self.dirty:
            self.dirty = False
            doc, seq = self._snapshot(), self.file.next_seq()
            try:
                await asyncio.to_thread(self.file.save, doc, seq)
            except OSError as e:
                self.dirty = True
                self.error = e
                log.error("saving %s to %s failed: %s", self.what, self.file.path, e)
                return
            self.error = None

    async def saved(self) -> None:
        """Wait for the changes so far to be on disk; raise the OSError of a save that failed."""
        if self._task is not None and not self._task.done():
            await asyncio.shield(self._task)
        if self.dirty and self.error is not None:
            raise self.error
