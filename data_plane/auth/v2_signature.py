"""RocketMQ 5 (gRPC) request signatures, as the official v5 clients compute them.

Every call carries, in its metadata::

    x-mq-date-time: 20260101T120000Z
    authorization:  MQv2-HMAC-SHA1 Credential=<access key>, SignedHeaders=x-mq-date-time, Signature=<hex>

    Signature = hex(HMAC-SHA1(key = secret key (UTF-8), message = the x-mq-date-time value))

The Java client writes the hex in upper case, the Python client in lower case: both verify. The
signed time bounds a replay: a signature whose time is further than ``max_skew_s`` from the
server's clock is refused (the Python client formats its local time with a ``Z``, so a client
whose clock zone is not UTC is off by its zone's offset).
"""

from __future__ import annotations

import calendar
import hashlib
import hmac
import time
from typing import Final, NamedTuple

from data_plane.auth.errors import AuthError

SCHEME: Final = "MQv2-HMAC-SHA1"
DATE_TIME_HEADER: Final = "x-mq-date-time"
MAX_HEADER_LENGTH: Final = 1024
DEFAULT_MAX_SKEW_S: Final = 900


class SignedRequest(NamedTuple):
    access_key: str
    signature: str


def parse(authorization: str) -> SignedRequest:
    """The access key and signature of an ``MQv2-HMAC-SHA1`` authorization value."""
    if len(authorization) > MAX_HEADER_LENGTH:
        raise AuthError("the authorization header is too long")
    scheme, _, rest = authorization.partition(" ")
    if scheme != SCHEME:
        raise AuthError(f"the authorization scheme is not {SCHEME} nor Bearer")
    fields: dict[str, str] = {}
    for part in rest.split(","):
        name, eq, value = part.strip().partition("=")
        if not eq:
            raise AuthError("the authorization header is not 'Credential=…, SignedHeaders=…, Signature=…'")
        fields[name] = value
    access_key = fields.get("Credential", "")
    signature = fields.get("Signature", "")
    if not access_key or not signature:
        raise AuthError("the authorization header names no Credential or no Signature")
    if fields.get("SignedHeaders", "").lower() != DATE_TIME_HEADER:
        raise AuthError(f"the signature must cover exactly {DATE_TIME_HEADER}")
    return SignedRequest(access_key, signature)


def sign(secret: str, date_time: str) -> str:
    return hmac.new(secret.encode(), date_time.encode(), hashlib.sha1).hexdigest()


def verify(signed: SignedRequest, secret: str, date_time: str, *, max_skew_s: float, now: float | None = None) -> None:
    """Raise AuthError unless ``signed`` is ``secret``'s signature of a recent ``date_time``."""
    try:
        when = calendar.timegm(time.strptime(date_time, "%Y%m%dT%H%M%SZ"))
    except ValueError:
        raise AuthError(f"{DATE_TIME_HEADER} is not a time like 20260101T120000Z") from None
    if abs((time.time() if now is None else now) - when) > max_skew_s:
        raise AuthError(f"{DATE_TIME_HEADER} is more than {max_skew_s:.0f} s from the server's clock")
    if not hmac.compare_digest(sign(secret, date_time), signed.signature.lower()):
        raise AuthError("signature does not match")
