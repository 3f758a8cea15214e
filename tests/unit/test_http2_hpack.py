"""HPACK (data_plane/http2/hpack.py): the examples of RFC 7541 Appendix C, decoded block after block
on one decoder with the dynamic table's entries and size checked after each (C.3 requests without
Huffman coding, C.4 with it, C.5 and C.6 responses with a 256-byte table and eviction); the integer
representation of C.1 both ways and the encoders' output read back; each malformed block refused
with ``HpackError`` (index 0, an index past the table, a size update above the limit or after a
field, a string past the block, an integer too long, a bad Huffman string); and a header list above
``max_list_size`` refused with ``HeaderListTooLarge`` after the table took its insertions."""

from __future__ import annotations

import pytest

from data_plane.http2.hpack import (
    STATIC_TABLE,
    Decoder,
    HeaderListTooLarge,
    HpackError,
    _int,
    encode_indexed,
    encode_int,
    encode_literal,
    encode_literal_indexed_name,
)

Headers = list[tuple[str, str]]


def table(decoder: Decoder) -> tuple[Headers, int]:
    """The dynamic table newest first (index 62 first, as the RFC lists it) and its size."""
    return list(reversed(decoder._entries)), decoder._size


def block(hex_text: str) -> bytes:
    return bytes.fromhex("".join(hex_text.split()))


# --- RFC 7541 C.3 and C.4: three requests on one connection ---------------------------------------
REQUESTS: list[Headers] = [
    [(":method", "GET"), (":scheme", "http"), (":path", "/"), (":authority", "www.example.com")],
    [
        (":method", "GET"),
        (":scheme", "http"),
        (":path", "/"),
        (":authority", "www.example.com"),
        ("cache-control", "no-cache"),
    ],
    [
        (":method", "GET"),
        (":scheme", "https"),
        (":path", "/index.html"),
        (":authority", "www.example.com"),
        ("custom-key", "custom-value"),
    ],
]
REQUEST_TABLES: list[tuple[Headers, int]] = [
    ([(":authority", "www.example.com")], 57),
    ([("cache-control", "no-cache"), (":authority", "www.example.com")], 110),
    ([("custom-key", "custom-value"), ("cache-control", "no-cache"), (":authority", "www.example.com")], 164),
]
C3_BLOCKS = [
    "8286 8441 0f77 7777 2e65 7861 6d70 6c65 2e63 6f6d",
    "8286 84be 5808 6e6f 2d63 6163 6865",
    "8287 85bf 400a 6375 7374 6f6d 2d6b 6579 0c63 7573 746f 6d2d 7661 6c75 65",
]
C4_BLOCKS = [
    "8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff",
    "8286 84be 5886 a8eb 1064 9cbf",
    "8287 85bf 4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf",
]

# --- RFC 7541 C.5 and C.6: three responses, a 256-byte table, eviction -----------------------------
DATE_21 = "Mon, 21 Oct 2013 20:13:21 GMT"
DATE_22 = "Mon, 21 Oct 2013 20:13:22 GMT"
COOKIE = "foo=ASDJKHQKBZXOQWEOPIUAXQWEOIU; max-age=3600; version=1"
RESPONSES: list[Headers] = [
    [(":status", "302"), ("cache-control", "private"), ("date", DATE_21), ("location", "https://www.example.com")],
    [(":status", "307"), ("cache-control", "private"), ("date", DATE_21), ("location", "https://www.example.com")],
    [
        (":status", "200"),
        ("cache-control", "private"),
        ("date", DATE_22),
        ("location", "https://www.example.com"),
        ("content-encoding", "gzip"),
        ("set-cookie", COOKIE),
    ],
]
RESPONSE_TABLES: list[tuple[Headers, int]] = [
    (
        [
            ("location", "https://www.example.com"),
            ("date", DATE_21),
            ("cache-control", "private"),
            (":status", "302"),
        ],
        222,
    ),
    (  # (":status", "302") was evicted to make room for (":status", "307")
        [
            (":status", "307"),
            ("location", "https://www.example.com"),
            ("date", DATE_21),
            ("cache-control", "private"),
        ],
        222,
    ),
    ([("set-cookie", COOKIE), ("content-encoding", "gzip"), ("date", DATE_22)], 215),
]
C5_BLOCKS = [
    """4803 3330 3258 0770 7269 7661 7465 611d 4d6f 6e2c 2032 3120 4f63 7420 3230 3133 2032 303a
    3133 3a32 3120 474d 546e 1768 7474 7073 3a2f 2f77 7777 2e65 7861 6d70 6c65 2e63 6f6d""",
    "4803 3330 37c1 c0bf",
    """88c1 611d 4d6f 6e2c 2032 3120 4f63 7420 3230 3133 2032 303a 3133 3a32 3220 474d 54c0 5a04
    677a 6970 7738 666f 6f3d 4153 444a 4b48 514b 425a 584f 5157 454f 5049 5541 5851 5745 4f49
    553b 206d 6178 2d61 6765 3d33 3630 303b 2076 6572 7369 6f6e 3d31""",
]
C6_BLOCKS = [
    """4882 6402 5885 aec3 771a 4b61 96d0 7abe 9410 54d4 44a8 2005 9504 0b81 66e0 82a6 2d1b ff6e
    919d 29ad 1718 63c7 8f0b 97c8 e9ae 82ae 43d3""",
    "4883 640e ffc1 c0bf",
    """88c1 6196 d07a be94 1054 d444 a820 0595 040b 8166 e084 a62d 1bff c05a 839b d9ab 77ad 94e7
    821d d7f2 e6c7 b335 dfdf cd5b 3960 d5af 2708 7f36 72c1 ab27 0fb5 291f 9587 3160 65c0 03ed
    4ee5 b106 3d50 07""",
]


@pytest.mark.parametrize("blocks", [C3_BLOCKS, C4_BLOCKS], ids=["C.3 without Huffman", "C.4 with Huffman"])
def test_the_rfc_requests_decode_one_after_another_with_the_table_after_each(blocks: list[str]) -> None:
    decoder = Decoder()
    for i, hex_text in enumerate(blocks):
        assert decoder.decode(block(hex_text)) == REQUESTS[i], f"request {i + 1}"
        assert table(decoder) == REQUEST_TABLES[i], f"the table after request {i + 1}"


@pytest.mark.parametrize("blocks", [C5_BLOCKS, C6_BLOCKS], ids=["C.5 without Huffman", "C.6 with Huffman"])
def test_the_rfc_responses_decode_with_a_256_byte_table_evicting_the_oldest(blocks: list[str]) -> None:
    decoder = Decoder(table_limit=256)  # SETTINGS_HEADER_TABLE_SIZE 256: the encoder's table is as large
    assert decoder.max_size == 256
    for i, hex_text in enumerate(blocks):
        assert decoder.decode(block(hex_text)) == RESPONSES[i], f"response {i + 1}"
        assert table(decoder) == RESPONSE_TABLES[i], f"the table after response {i + 1}"


def test_a_size_update_at_the_start_of_a_block_shrinks_the_table_and_evicts() -> None:
    decoder = Decoder(table_limit=256)
    for hex_text in C5_BLOCKS[:2]:
        decoder.decode(block(hex_text))
    # Size update to 110 (room for the newest two entries, 42 + 63), then index 62.
    assert decoder.decode(encode_int(110, 5, 0x20) + encode_indexed(62)) == [(":status", "307")]
    assert table(decoder) == ([(":status", "307"), ("location", "https://www.example.com")], 105)
    assert decoder.decode(encode_int(0, 5, 0x20)) == []
    assert table(decoder) == ([], 0)
    assert decoder.max_size == 0


def test_an_entry_larger_than_the_table_empties_it_and_is_not_kept() -> None:
    decoder = Decoder(table_limit=64)
    decoder.decode(block(C3_BLOCKS[0]))  # (":authority", "www.example.com"): 57 bytes
    assert table(decoder) == ([(":authority", "www.example.com")], 57)
    big = b"\x40" + encode_int(4, 7) + b"name" + encode_int(40, 7) + b"v" * 40  # 76 bytes > 64
    assert decoder.decode(big) == [("name", "v" * 40)]
    assert table(decoder) == ([], 0)


def test_never_indexed_and_indexed_name_literals_leave_the_table_alone() -> None:
    decoder = Decoder()
    data = (
        b"\x10" + encode_int(6, 7) + b"secret" + encode_int(2, 7) + b"pw"  # never indexed, new name
        + encode_literal_indexed_name(4, b"/x")  # without indexing, name :path from the static table
        + encode_literal(b"te", b"trailers")
    )  # fmt: skip
    assert decoder.decode(data) == [("secret", "pw"), (":path", "/x"), ("te", "trailers")]
    assert table(decoder) == ([], 0)


def test_every_static_entry_decodes_from_its_index() -> None:
    decoder = Decoder(max_list_size=1 << 20)
    data = b"".join(encode_indexed(i) for i in range(1, len(STATIC_TABLE) + 1))
    assert decoder.decode(data) == list(STATIC_TABLE)


# --- integers (RFC 7541 C.1) ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("value", "prefix", "encoded"),
    [(10, 5, "0a"), (1337, 5, "1f9a0a"), (42, 8, "2a"), (31, 5, "1f00"), (0, 7, "00"), (127, 7, "7f00")],
)
def test_integers_encode_and_decode_as_the_rfc_writes_them(value: int, prefix: int, encoded: str) -> None:
    assert encode_int(value, prefix).hex() == encoded
    assert _int(bytes.fromhex(encoded), 0, prefix) == (value, len(encoded) // 2)


def test_the_leading_bits_of_a_representation_are_kept_beside_the_prefix() -> None:
    assert encode_int(10, 5, 0xE0).hex() == "ea"  # RFC C.1.1: three bits of something else
    assert encode_int(1337, 5, 0xE0).hex() == "ff9a0a"
    assert _int(bytes.fromhex("ff9a0a"), 0, 5) == (1337, 3)


def test_integers_round_trip_through_each_prefix() -> None:
    for prefix in range(1, 9):
        for value in (*range(300), 2**14, 2**21 - 1, 2**28 + 12345):
            coded = b"\x00" + encode_int(value, prefix)  # at an offset: positions count from it
            assert _int(coded, 1, prefix) == (value, len(coded)), (value, prefix)


def test_what_the_encoders_write_the_decoder_reads() -> None:
    data = (
        encode_indexed(3)
        + encode_literal_indexed_name(4, b"/apache.rocketmq.v2.MessagingService/QueryRoute")
        + encode_literal(b"x-long", b"v" * 300)  # a length above the 7-bit prefix
        + encode_literal(b"", b"")
    )
    assert Decoder().decode(data) == [
        (":method", "POST"),
        (":path", "/apache.rocketmq.v2.MessagingService/QueryRoute"),
        ("x-long", "v" * 300),
        ("", ""),
    ]


# --- malformed blocks -----------------------------------------------------------------------------
def test_index_0_is_refused() -> None:
    with pytest.raises(HpackError, match="index 0"):
        Decoder().decode(b"\x80")


def test_an_index_past_the_static_and_dynamic_tables_is_refused() -> None:
    decoder = Decoder()
    with pytest.raises(HpackError, match="index 62"):
        decoder.decode(encode_indexed(62))
    decoder.decode(block(C3_BLOCKS[0]))  # one dynamic entry: 62 is it, 63 is past it
    assert decoder.decode(encode_indexed(62)) == [(":authority", "www.example.com")]
    with pytest.raises(HpackError, match="index 63"):
        decoder.decode(encode_indexed(63))


def test_a_literal_naming_an_index_past_the_table_is_refused() -> None:
    with pytest.raises(HpackError, match="index 70"):
        Decoder().decode(encode_literal_indexed_name(70, b"x"))


def test_a_size_update_above_the_advertised_limit_is_refused() -> None:
    decoder = Decoder(table_limit=256)
    assert decoder.decode(encode_int(256, 5, 0x20)) == []
    with pytest.raises(HpackError, match="257"):
        decoder.decode(encode_int(257, 5, 0x20))


def test_a_size_update_after_a_field_is_refused() -> None:
    with pytest.raises(HpackError, match="after the first field"):
        Decoder().decode(encode_indexed(2) + encode_int(100, 5, 0x20))


def test_a_string_running_past_its_block_is_refused() -> None:
    whole = encode_literal(b"name", b"value")
    for cut in range(1, len(whole)):
        with pytest.raises(HpackError):
            Decoder().decode(whole[:cut])


def test_an_integer_of_too_many_continuation_bytes_is_refused() -> None:
    with pytest.raises(HpackError, match="too large"):
        Decoder().decode(b"\xff" + b"\x80" * 10 + b"\x01")


def test_a_block_ending_inside_an_integer_is_refused() -> None:
    with pytest.raises(HpackError, match="inside an integer"):
        Decoder().decode(b"\xff\x80")


@pytest.mark.parametrize(
    "coded",
    [b"\xff\xff\xff\xff", b"\x00", b"\xff", b"\xfe"],
    ids=["EOS", "padding of 0-bits", "padding of 8 bits", "a code cut short"],
)
def test_an_invalid_huffman_string_is_refused(coded: bytes) -> None:
    data = b"\x00" + encode_int(len(coded), 7, 0x80) + coded + encode_int(1, 7) + b"v"
    with pytest.raises(HpackError):
        Decoder().decode(data)


# --- header list size -------------------------------------------------------------------------------
def test_a_header_list_above_the_limit_is_refused_after_the_table_took_its_entries() -> None:
    decoder = Decoder(max_list_size=200)
    value = b"v" * 180
    data = b"\x40" + encode_int(8, 7) + b"x-custom" + encode_int(len(value), 7) + value  # indexed
    with pytest.raises(HeaderListTooLarge) as raised:
        decoder.decode(data + encode_indexed(2))
    assert raised.value.size == 8 + 180 + 32 + 7 + 3 + 32
    assert raised.value.limit == 200
    # The peer's encoder inserted the entry: its next block names it, and that must decode.
    assert table(decoder) == ([("x-custom", "v" * 180)], 220)
    with pytest.raises(HeaderListTooLarge):  # (220 bytes as a list: still too large)
        decoder.decode(encode_indexed(62))
    decoder.max_list_size = 1024
    assert decoder.decode(encode_indexed(62) + encode_indexed(2)) == [("x-custom", "v" * 180), (":method", "GET")]


def test_a_header_list_at_the_limit_is_taken() -> None:
    decoder = Decoder(max_list_size=32 + 2 + 8)
    assert decoder.decode(encode_literal(b"te", b"trailers")) == [("te", "trailers")]
    decoder.max_list_size -= 1
    with pytest.raises(HeaderListTooLarge):
        decoder.decode(encode_literal(b"te", b"trailers"))


def test_a_block_decoded_again_after_the_table_changed_reads_the_new_table() -> None:
    decoder = Decoder()
    first = b"\x40" + encode_int(1, 7) + b"a" + encode_int(1, 7) + b"1"  # literal with indexing: a: 1
    second = b"\x40" + encode_int(1, 7) + b"b" + encode_int(1, 7) + b"2"  # b: 2, now at index 62
    newest = b"\xbe"  # indexed 62: the newest entry of the dynamic table
    assert decoder.decode(first) == [("a", "1")]
    assert decoder.decode(newest) == [("a", "1")]
    assert decoder.decode(newest) == [("a", "1")]  # (the same bytes, the same table: remembered)
    assert decoder.decode(second) == [("b", "2")]
    assert decoder.decode(newest) == [("b", "2")]
    got = decoder.decode(newest)
    got.append(("x", "y"))  # a caller's list is its own
    assert decoder.decode(newest) == [("b", "2")]
