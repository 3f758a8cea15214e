"""data_plane/auth/signature.py: RocketMQ ACL signatures as stock clients compute them."""

from __future__ import annotations

import base64
import hashlib
import hmac
import random
import string

import pytest

from data_plane.auth.signature import UNIQUE_MSG_QUERY_FLAG, VERSION_4_9_3, content, sign, verify


def _reference(message: bytes, secret: str) -> str:
    return base64.b64encode(hmac.new(secret.encode(), message, hashlib.sha1).digest()).decode()


def test_content_is_values_sorted_by_key_then_the_body() -> None:
    # Java's TreeMap order: upper case sorts before lower case; keys themselves are not included.
    ext = {"topic": "acme%orders", "AccessKey": "AK1", "b": "x", "Signature": "ignored", "OnsChannel": "ALIYUN"}
    assert content(ext, b"BODY") == b"AK1ALIYUNxacme%ordersBODY"
    assert content(ext, None) == b"AK1ALIYUNxacme%orders"
    assert content(None, b"") == b""


def test_sign_is_base64_hmac_sha1_of_the_content() -> None:
    ext = {"AccessKey": "AK1", "consumerGroup": "acme%g", "topic": "acme%t", "queueId": "3"}
    expected = _reference(b"AK1acme%g3acme%t" + b"payload", "s3cret")
    assert sign(ext, b"payload", "s3cret") == expected
    assert verify({**ext, "Signature": expected}, b"payload", "s3cret")


def test_non_ascii_values_are_signed_as_utf8() -> None:
    ext = {"AccessKey": "AK1", "k": "héllo✓"}
    assert sign(ext, None, "sk") == _reference("AK1héllo✓".encode(), "sk")


def test_verify_refuses_a_missing_or_wrong_signature() -> None:
    ext = {"AccessKey": "AK1", "topic": "acme%t"}
    sig = sign(ext, b"b", "sk")
    assert not verify(ext, b"b", "sk")
    assert not verify({**ext, "Signature": ""}, b"b", "sk")
    assert not verify({**ext, "Signature": sig}, b"b", "other")
    assert not verify({**ext, "Signature": sig}, b"c", "sk")
    assert not verify({**ext, "topic": "acme%u", "Signature": sig}, b"b", "sk")


def test_randomized_signatures_verify_and_any_change_breaks_them(seed: int) -> None:
    rng = random.Random(seed)
    alphabet = string.ascii_letters + string.digits + "%_-:é"
    for _ in range(200):
        ext = {
            "".join(rng.choices(string.ascii_letters, k=rng.randint(1, 8))): "".join(
                rng.choices(alphabet, k=rng.randint(0, 20))
            )
            for _ in range(rng.randint(0, 8))
        }
        ext["AccessKey"] = "AK" + str(rng.randrange(10**6))
        body = rng.randbytes(rng.randint(0, 64)) if rng.random() < 0.7 else None
        secret = "".join(rng.choices(alphabet, k=16))
        signed = {**ext, "Signature": sign(ext, body, secret)}
        assert verify(signed, body, secret)
        tampered = dict(signed)
        key = rng.choice(sorted(ext))
        tampered[key] = tampered[key] + "x"
        assert not verify(tampered, body, secret)
        assert not verify(signed, (body or b"") + b"!", secret)


def test_unique_key_query_field_is_left_out_for_clients_up_to_4_9_3() -> None:
    ext = {"AccessKey": "AK1", "topic": "acme%t", "key": "k1", UNIQUE_MSG_QUERY_FLAG: "true"}
    without = {k: v for k, v in ext.items() if k != UNIQUE_MSG_QUERY_FLAG}
    old_client_sig = sign(without, None, "sk")  # 4.9.3 and older signed before adding the flag
    new_client_sig = sign(ext, None, "sk")
    assert verify({**ext, "Signature": old_client_sig}, None, "sk", version=VERSION_4_9_3)
    assert verify({**ext, "Signature": new_client_sig}, None, "sk", version=VERSION_4_9_3 + 2)
    # Either form is accepted whatever the version says (only when the field is present).
    assert verify({**ext, "Signature": new_client_sig}, None, "sk", version=VERSION_4_9_3)
    assert verify({**ext, "Signature": old_client_sig}, None, "sk", version=VERSION_4_9_3 + 2)


@pytest.mark.parametrize("secret", ["", "x" * 200])
def test_any_secret_length_signs(secret: str) -> None:
    ext = {"AccessKey": "AK"}
    assert verify({**ext, "Signature": sign(ext, b"", secret)}, b"", secret)
