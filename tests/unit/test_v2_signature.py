"""The RocketMQ 5 clients' MQv2-HMAC-SHA1 signature: what verifies and what does not."""

from __future__ import annotations

import calendar
import time

import pytest

from data_plane.auth import v2_signature
from data_plane.auth.errors import AuthError

WHEN = "20261207T021500Z"
NOW = calendar.timegm(time.strptime(WHEN, "%Y%m%dT%H%M%SZ"))


def header(ak: str, sig: str, signed: str = "x-mq-date-time") -> str:
    return f"MQv2-HMAC-SHA1 Credential={ak}, SignedHeaders={signed}, Signature={sig}"


def test_a_signature_verifies_in_either_case_of_hex() -> None:
    sig = v2_signature.sign("s3cret", WHEN)
    assert sig == f"{int(sig, 16):040x}"  # lower-case hex, 20 bytes
    assert len(sig) == 40
    for form in (sig, sig.upper()):
        signed = v2_signature.parse(header("AK1", form))
        assert signed.access_key == "AK1"
        v2_signature.verify(signed, "s3cret", WHEN, max_skew_s=900, now=NOW + 10)


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("Basic abc", "scheme"),
        ("MQv2-HMAC-SHA1 Credential", "not 'Credential"),
        ("MQv2-HMAC-SHA1 Credential=AK1", "no Signature"),
        (header("", "ab"), "no Credential"),
        (header("AK1", "ab", "host"), "exactly x-mq-date-time"),
        ("MQv2-HMAC-SHA1 " + "x" * 2000, "too long"),
    ],
)
def test_malformed_headers_are_refused_with_a_reason(value: str, why: str) -> None:
    with pytest.raises(AuthError, match=why):
        v2_signature.parse(value)


def test_a_wrong_secret_an_old_time_and_a_bad_time_are_refused() -> None:
    signed = v2_signature.parse(header("AK1", v2_signature.sign("s3cret", WHEN)))
    with pytest.raises(AuthError, match="does not match"):
        v2_signature.verify(signed, "other", WHEN, max_skew_s=900, now=NOW)
    with pytest.raises(AuthError, match="from the server's clock"):
        v2_signature.verify(signed, "s3cret", WHEN, max_skew_s=900, now=NOW + 901)
    with pytest.raises(AuthError, match="not a time"):
        v2_signature.verify(signed, "s3cret", "yesterday", max_skew_s=900, now=NOW)
