"""Files at rest for the auth package: atomic writes, the 0600 key file, sealed files.

``write_atomic`` writes ``<path>.tmp`` (mode 0600), fsyncs it, renames it over ``path`` and
fsyncs the directory: a crash leaves the old file or the new one, never a torn one.
``load_or_create_key`` reads a 32-byte key file, creating it (O_EXCL, mode 0600) when missing,
and refuses one that group or others can read. ``SealedFile`` keeps a secret document encrypted
at rest (AES-256-GCM) under such a key::

    ┌──────────┬────────────┬─────────────────────────────────────┐
    │ magic  8 │ nonce 12   │ AES-GCM(plaintext) + 16-byte tag    │
    └──────────┴────────────┴─────────────────────────────────────┘
      the magic names the kind of document and is the cipher's associated data, so one sealed
      file copied over another kind does not open; a fresh nonce on every write
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

KEY_BYTES = 32
NONCE_BYTES = 12
TAG_BYTES = 16


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


class SealedFileError(Exception):
    """A sealed file that cannot be used (unreadable, another kind of file, another key or
    tampered); the message says which, never any content."""


class SealedFile:
    """``path`` sealed under the key in ``key_path`` (created, 0600, at the first use), as a
    document of the kind ``magic`` (8 bytes)."""

    def __init__(self, path: str, key_path: str, magic: bytes) -> None:
        if len(magic) != 8:
            raise ValueError("a sealed file's magic is 8 bytes")
        self.path = path
        self.key_path = key_path
        self.magic = magic
        self._aead: AESGCM | None = None

    def _cipher(self) -> AESGCM:
        if self._aead is None:
            self._aead = AESGCM(load_or_create_key(self.key_path))
        return self._aead

    def write(self, plaintext: bytes) -> None:
        """Seal and write atomically (mode 0600); OSError when it cannot be written."""
        nonce = os.urandom(NONCE_BYTES)
        write_atomic(self.path, self.magic + nonce + self._cipher().encrypt(nonce, plaintext, self.magic))

    def read(self) -> bytes | None:
        """The plaintext; None when there is no file; SealedFileError when it cannot be used."""
        try:
            with open(self.path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            return None
        except OSError as e:
            raise SealedFileError(f"cannot read {self.path}: {e}") from None
        head = len(self.magic) + NONCE_BYTES
        if not raw.startswith(self.magic) or len(raw) < head + TAG_BYTES:
            raise SealedFileError(f"{self.path} is not a sealed file of this kind")
        try:
            return self._cipher().decrypt(raw[len(self.magic) : head], raw[head:], self.magic)
        except InvalidTag:
            raise SealedFileError(
                f"{self.path} does not decrypt with key file {self.key_path} (other key or tampered)"
            ) from None
