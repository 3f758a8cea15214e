"""RocketMQ ACL request signatures, as stock clients compute them (``AclClientRPCHook`` in the
Java client, ``ClientRPCHook`` in the C++ client) and brokers check them (``PlainAccessValidator``).

The client adds ``AccessKey`` (and ``SecurityToken`` when it has one; the C++ client also adds
``OnsChannel``) to the request's extFields, then::

    content   = concat(value for key, value in sorted(extFields) if key != "Signature")  (UTF-8)
                + body bytes (when there is a body)
    Signature = base64(HMAC-SHA1(key = secret key (UTF-8), message = content))

Keys sort by Java's ``String.compareTo`` (UTF-16 code units; the C++ client's ``std::map`` sorts
bytes): identical to Python's ordering for the ASCII names every header uses. Only values are
concatenated, without separators — keys do not enter the content.

One quirk of the Java broker: for requests whose ``version`` is 4.9.3 or older (ordinal ≤ 399),
the ``_UNIQUE_KEY_QUERY`` field is left out of the content (those clients added it after signing).
``verify`` follows that rule and, only when the field is present, also accepts the other form.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Mapping
from typing import Final

ACCESS_KEY: Final = "AccessKey"
SIGNATURE: Final = "Signature"
SECURITY_TOKEN: Final = "SecurityToken"
ONS_CHANNEL: Final = "OnsChannel"
UNIQUE_MSG_QUERY_FLAG: Final = "_UNIQUE_KEY_QUERY"
VERSION_4_9_3: Final = 399  # MQVersion.Version.V4_9_3.ordinal()


def _header_content(ext_fields: Mapping[str, str] | None, skip: frozenset[str] = frozenset()) -> bytes:
    if not ext_fields:
        return b""
    return "".join([ext_fields[k] for k in sorted(ext_fields) if k != SIGNATURE and k not in skip]).encode()


def content(ext_fields: Mapping[str, str] | None, body: bytes | None, *, skip: frozenset[str] = frozenset()) -> bytes:
    """The bytes a signature covers: sorted values (without ``Signature``) then the body."""
    return _header_content(ext_fields, skip) + (body or b"")


def _digest(key: bytes, ext_fields: Mapping[str, str] | None, body: bytes | None, skip: frozenset[str]) -> bytes:
    mac = hmac.new(key, _header_content(ext_fields, skip), hashlib.sha1)
    if body:
        mac.update(body)  # no copy of a large body
    return base64.b64encode(mac.digest())


def sign(ext_fields: Mapping[str, str] | None, body: bytes | None, secret: str) -> str:
    """The ``Signature`` value for a request carrying ``ext_fields`` (including ``AccessKey``)
    and ``body``, signed with ``secret``."""
    return _digest(secret.encode(), ext_fields, body, frozenset()).decode("ascii")


_SKIP_UNIQUE = frozenset((UNIQUE_MSG_QUERY_FLAG,))


def verify(ext_fields: Mapping[str, str], body: bytes | None, secret: str, *, version: int = VERSION_4_9_3 + 1) -> bool:
    """Whether ``ext_fields["Signature"]`` is the signature of this request under ``secret``
    (compared in constant time)."""
    given = ext_fields.get(SIGNATURE)
    if not given:
        return False
    given_b = given.encode()
    key = secret.encode()
    has_unique = UNIQUE_MSG_QUERY_FLAG in ext_fields
    first = _SKIP_UNIQUE if has_unique and version <= VERSION_4_9_3 else frozenset()
    if hmac.compare_digest(_digest(key, ext_fields, body, first), given_b):
        return True
    if has_unique:  # the other client generation's form
        other = frozenset() if first else _SKIP_UNIQUE
        return hmac.compare_digest(_digest(key, ext_fields, body, other), given_b)
    return False
