"""Sealing: AES-256-GCM encryption of secrets at rest under the master key.

A sealed value is ``version (1 byte) | nonce (12 bytes) | ciphertext + tag (16 bytes)``. The
associated data names what is sealed (``b"credential:" + access_key``, ``b"signing-key:" + kid``),
so a sealed value copied onto another row does not open.
"""

from __future__ import annotations

import os

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from control_plane.settings import MasterKey

SEAL_VERSION = 1
NONCE_BYTES = 12


class SealError(Exception):
    """A sealed value that does not open under this master key (wrong key, or tampered)."""


class Sealer:
    def __init__(self, master_key: MasterKey) -> None:
        self._aead = AESGCM(master_key.value)

    def seal(self, plaintext: bytes, *, context: bytes) -> bytes:
        nonce = os.urandom(NONCE_BYTES)
        return bytes([SEAL_VERSION]) + nonce + self._aead.encrypt(nonce, plaintext, context)

    def open(self, sealed: bytes, *, context: bytes) -> bytes:
        if len(sealed) < 1 + NONCE_BYTES + 16 or sealed[0] != SEAL_VERSION:
            raise SealError("not a sealed value of a known version")
        nonce = sealed[1 : 1 + NONCE_BYTES]
        try:
            return self._aead.decrypt(nonce, sealed[1 + NONCE_BYTES :], context)
        except InvalidTag:
            raise SealError("sealed value does not open under this master key") from None
