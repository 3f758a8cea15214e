"""The HPACK Huffman code (data_plane/http2/huffman.py): its table checked as a code, the examples of
RFC 7541 Appendix C.4 and C.6, round trips, and each string that section 5.2 calls a decoding error."""

from __future__ import annotations

import itertools
import os
import random
from fractions import Fraction

import pytest

from data_plane.http2.huffman import CODES, EOS, HuffmanError, decode, encode, encoded_length

# RFC 7541 Appendix C.4 (requests) and C.6 (responses).
RFC_EXAMPLES = [
    (b"www.example.com", "f1e3c2e5f23a6ba0ab90f4ff"),
    (b"no-cache", "a8eb10649cbf"),
    (b"custom-key", "25a849e95ba97d7f"),
    (b"custom-value", "25a849e95bb8e8b4bf"),
    (b"302", "6402"),
    (b"307", "640eff"),
    (b"private", "aec3771a4b"),
    (b"Mon, 21 Oct 2013 20:13:21 GMT", "d07abe941054d444a8200595040b8166e082a62d1bff"),
    (b"Mon, 21 Oct 2013 20:13:22 GMT", "d07abe941054d444a8200595040b8166e084a62d1bff"),
    (b"https://www.example.com", "9d29ad171863c78f0b97c8e9ae82ae43d3"),
    (b"gzip", "9bd9ab"),
    (
        b"foo=ASDJKHQKBZXOQWEOPIUAXQWEOIU; max-age=3600; version=1",
        "94e7821dd7f2e6c7b335dfdfcd5b3960d5af27087f3672c1ab270fb5291f9587316065c003ed4ee5b1063d5007",
    ),
]


def test_the_table_has_a_code_for_each_byte_and_for_eos() -> None:
    assert len(CODES) == 257
    assert CODES[EOS] == (0x3FFFFFFF, 30)


def test_the_table_is_a_complete_prefix_code() -> None:
    assert all(0 <= code < 1 << length for code, length in CODES)
    assert sum(Fraction(1, 1 << length) for _, length in CODES) == 1


def test_the_table_is_canonical() -> None:
    ordered = sorted(range(257), key=lambda symbol: (CODES[symbol][1], symbol))
    assert CODES[ordered[0]][0] == 0
    for before, after in itertools.pairwise(ordered):
        (code, length), (next_code, next_length) = CODES[before], CODES[after]
        assert next_code == (code + 1) << (next_length - length), (before, after)


@pytest.mark.parametrize(("text", "coded"), RFC_EXAMPLES)
def test_the_rfc_examples_encode_and_decode(text: bytes, coded: str) -> None:
    assert encode(text).hex() == coded
    assert encoded_length(text) == len(coded) // 2
    assert decode(bytes.fromhex(coded)) == text
    assert decode(memoryview(bytes.fromhex(coded))) == text


def test_every_single_byte_round_trips() -> None:
    for byte in range(256):
        data = bytes((byte,))
        assert len(encode(data)) == encoded_length(data)
        assert decode(encode(data)) == data, byte


def test_the_empty_string_encodes_to_nothing_and_back() -> None:
    assert encode(b"") == b""
    assert encoded_length(b"") == 0
    assert decode(b"") == b""


def test_random_strings_round_trip() -> None:
    seed = int.from_bytes(os.urandom(4), "big")
    print(f"seed {seed}")
    rng = random.Random(seed)
    for _ in range(500):
        data = rng.randbytes(rng.randrange(0, 200))
        coded = encode(data)
        assert len(coded) == encoded_length(data), seed
        assert decode(coded) == data, seed
        header_like = bytes(rng.choices(b"abcdefghijklmnopqrstuvwxyz0123456789-_./:;=, ", k=rng.randrange(0, 200)))
        assert decode(encode(header_like)) == header_like, seed


def test_the_padding_is_the_first_bits_of_eos() -> None:
    assert encode(b"a") == bytes((0b00011_111,))  # 'a' is 00011
    assert encode(b"0") == bytes((0b00000_111,))


@pytest.mark.parametrize(
    "coded",
    [
        bytes.fromhex("ffffffff"),  # EOS, then 2 bits of padding
        bytes.fromhex("fffffffc"),  # EOS, then '0' cut short
        encode(b"ab") + bytes.fromhex("ffffffff"),
        bytes.fromhex("ffffffff") + encode(b"ab"),
    ],
)
def test_a_string_holding_eos_is_refused(coded: bytes) -> None:
    with pytest.raises(HuffmanError, match="EOS symbol"):
        decode(coded)


@pytest.mark.parametrize(
    ("coded", "bits"),
    [
        (b"\xff", 8),
        (encode(b"a") + b"\xff", 11),  # 'a' (5 bits), then 3 + 8 one-bits
        (b"\xff\xff", 16),
        (encode(b"a" + bytes((2,)))[:3], 19),  # byte 2's 28-bit code starts with 23 one-bits
    ],
)
def test_padding_longer_than_seven_bits_is_refused(coded: bytes, bits: int) -> None:
    with pytest.raises(HuffmanError, match=rf"ends in {bits} bits of padding \(more than 7\)"):
        decode(coded)


@pytest.mark.parametrize(
    ("coded", "bits"),
    [
        (bytes((0b00011_110,)), 3),  # 'a', then padding 110
        (bytes((0b00011_011,)), 3),
        (bytes((0b0_0000000,)), 3),  # '0' (00000), then 000
        (bytes((0b00011_000, 0b00_111110)), 6),  # 'a', '0', then 111110
    ],
)
def test_padding_with_a_zero_bit_is_refused(coded: bytes, bits: int) -> None:
    with pytest.raises(HuffmanError, match=rf"padding \({bits} bits\) is not all 1-bits"):
        decode(coded)


def test_a_string_cut_inside_a_code_is_refused() -> None:
    coded = encode(b"a" + bytes((2,)))  # 5 + 28 bits: byte 2's code is 1111111111111111111111100010
    assert len(coded) == 5
    with pytest.raises(HuffmanError, match=r"ends inside a code \(27 bits of it\)"):
        decode(coded[:4])
