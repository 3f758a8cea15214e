"""Files at rest for the auth package: atomic writes and the 0600 key file.

``write_atomic`` writes ``<path>.tmp`` (mode 0600), fsyncs it, renames it over ``path`` and
fsyncs the directory: a crash leaves the old file or the new one, never a torn one.
``load_or_create_key`` reads a 32-byte key file, creating it (O_EXCL, mode 0600) when missing,
and refuses one that group or others can read.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat

KEY_BYTES = 32


class KeyFileError(OSError):
    """A key file that cannot be used (wrong size, readable by others)."""


def write_atomic(path: str, data: bytes, *, mode: int = 0o600) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    tmp = f"{path}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.fchmod(fd, mode)
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dfd = os.open(directory, os.O_RDONLY)
    try:
        with contextlib.suppress(OSError):  # some filesystems refuse fsync on a directory
            os.fsync(dfd)
    finally:
        os.close(dfd)


def load_or_create_key(path: str) -> bytes:
    """The 32-byte key in ``path``; a new random one is written there (mode 0600) if missing."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        key = secrets.token_bytes(KEY_BYTES)
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:  # created meanwhile by another process: use that one
            return load_or_create_key(path)
        try:
            os.write(fd, key)
            os.fsync(fd)
        finally:
            os.close(fd)
        return key
    try:
        st = os.fstat(fd)
        if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise KeyFileError(
                f"key file {path} is accessible by group or others (mode {stat.S_IMODE(st.st_mode):o}); chmod 600 it"
            )
        key = os.read(fd, KEY_BYTES + 1)
    finally:
        os.close(fd)
    if len(key) != KEY_BYTES:
        raise KeyFileError(f"key file {path} holds {len(key)} bytes, not {KEY_BYTES}")
    return key
