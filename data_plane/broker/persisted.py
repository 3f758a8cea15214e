"""ConfigFile: a JSON document kept on disk atomically (RocketMQ's ConfigManager).

Saving writes ``<name>.tmp``, fsyncs it, keeps the previous file as ``<name>.bak`` and renames
the new one into place, then fsyncs the directory; a crash at any point leaves either the old or
the new document. Loading falls back to ``.bak`` when the main file is missing or unreadable.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from typing import Any

import orjson

log = logging.getLogger(__name__)


class ConfigFile:
    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()  # saves may come from the loop and from a worker thread
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

    def save(self, doc: dict[str, Any]) -> None:
        data = orjson.dumps(doc, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS)
        with self._lock:
            self._write(data)

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
