"""Slow, salted hashes of credential secrets (scrypt), checked in constant time.

Stored form: ``scrypt$<log2 n>$<r>$<p>$<salt b64>$<hash b64>``, so the cost can rise later
without breaking stored hashes. Hashing takes tens of milliseconds on purpose: callers on the
event loop run it in a thread (``asyncio.to_thread``).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os

LOG2_N = 14
R = 8
P = 1
SALT_BYTES = 16
HASH_BYTES = 32


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def hash_secret(secret: str, *, log2_n: int = LOG2_N) -> str:
    salt = os.urandom(SALT_BYTES)
    digest = hashlib.scrypt(secret.encode(), salt=salt, n=1 << log2_n, r=R, p=P, dklen=HASH_BYTES)
    return f"scrypt${log2_n}${R}${P}${_b64(salt)}${_b64(digest)}"


def verify_secret(secret: str, stored: str) -> bool:
    try:
        scheme, log2_n, r, p, salt, expected = stored.split("$")
        if scheme != "scrypt" or not 10 <= int(log2_n) <= 20:
            return False
        digest = hashlib.scrypt(
            secret.encode(),
            salt=base64.b64decode(salt),
            n=1 << int(log2_n),
            r=int(r),
            p=int(p),
            dklen=HASH_BYTES,
        )
    except ValueError:
        return False
    return hmac.compare_digest(digest, base64.b64decode(expected))


# Checked against when the access key is unknown, so that answer takes as long as a wrong secret.
DUMMY_HASH = hash_secret("orbit-dummy-secret-for-constant-time")
