"""Typed reads of a request's extFields (data_plane/remoting/headers.py): field_str, field_int,
field_bool and field_opt_str on present, missing, empty, float-shaped, out-of-range and garbage
values. Every refusal is a HeaderError whose message names the field."""

from __future__ import annotations

import pytest

from data_plane.remoting.errors import HeaderError
from data_plane.remoting.headers import INT64_MAX, INT64_MIN, field_bool, field_int, field_opt_str, field_str


# --- field_str -----------------------------------------------------------------------------------
def test_field_str_returns_the_value() -> None:
    assert field_str({"topic": "TopicTest"}, "topic") == "TopicTest"


@pytest.mark.parametrize("ext", [None, {}, {"other": "x"}, {"topic": ""}])
def test_field_str_refuses_a_missing_or_empty_field_naming_it(ext: dict[str, str] | None) -> None:
    with pytest.raises(HeaderError, match="missing header field 'topic'"):
        field_str(ext, "topic")


@pytest.mark.parametrize("ext", [None, {}, {"topic": ""}])
def test_field_str_returns_the_default_for_a_missing_or_empty_field(ext: dict[str, str] | None) -> None:
    assert field_str(ext, "topic", "fallback") == "fallback"


def test_field_str_refuses_a_value_over_its_maximum_length_naming_the_field() -> None:
    assert field_str({"topic": "x" * 10}, "topic", max_length=10) == "x" * 10
    with pytest.raises(HeaderError, match=r"'topic' is longer than 10"):
        field_str({"topic": "x" * 11}, "topic", max_length=10)


# --- field_opt_str -----------------------------------------------------------------------------
@pytest.mark.parametrize("ext", [None, {}, {"keys": ""}])
def test_field_opt_str_is_none_for_a_missing_or_empty_field(ext: dict[str, str] | None) -> None:
    assert field_opt_str(ext, "keys") is None


def test_field_opt_str_returns_a_present_value() -> None:
    assert field_opt_str({"keys": "k1 k2"}, "keys") == "k1 k2"


# --- field_int ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("raw", "value"),
    [
        ("0", 0),
        ("42", 42),
        ("-7", -7),
        ("3.0", 3),  # a float-shaped whole number, as "3" sent as a JSON 3.0 becomes
        ("-2.0", -2),
        ("1e3", 1000),
        ("1700000000123", 1_700_000_000_123),
        (str(INT64_MAX), INT64_MAX),
        (str(INT64_MIN), INT64_MIN),
    ],
)
def test_field_int_reads_whole_numbers(raw: str, value: int) -> None:
    assert field_int({"queueId": raw}, "queueId") == value


@pytest.mark.parametrize("ext", [None, {}, {"queueId": ""}])
def test_field_int_refuses_a_missing_or_empty_field_naming_it(ext: dict[str, str] | None) -> None:
    with pytest.raises(HeaderError, match="missing header field 'queueId'"):
        field_int(ext, "queueId")


@pytest.mark.parametrize("ext", [None, {}, {"queueId": ""}])
def test_field_int_returns_the_default_for_a_missing_or_empty_field(ext: dict[str, str] | None) -> None:
    assert field_int(ext, "queueId", 0) == 0
    assert field_int(ext, "queueId", -1) == -1


@pytest.mark.parametrize("raw", ["abc", "12abc", "0x10", "1,000", "true", "[1]", "--1"])
def test_field_int_refuses_garbage_naming_the_field(raw: str) -> None:
    with pytest.raises(HeaderError, match="'queueId' is not a number"):
        field_int({"queueId": raw}, "queueId")


@pytest.mark.parametrize("raw", ["3.5", "-0.1", "1e-3", "nan", "inf", "-inf", "1e400"])
def test_field_int_refuses_a_number_that_is_not_whole_naming_the_field(raw: str) -> None:
    with pytest.raises(HeaderError, match="'queueId' is not a whole number"):
        field_int({"queueId": raw}, "queueId")


@pytest.mark.parametrize(
    ("raw", "lo", "hi"),
    [
        ("8", 0, 7),
        ("-1", 0, 7),
        ("8.0", 0, 7),
        (str(INT64_MAX + 1), INT64_MIN, INT64_MAX),
        (str(INT64_MIN - 1), INT64_MIN, INT64_MAX),
        ("1e30", INT64_MIN, INT64_MAX),
        ("9.3e18", INT64_MIN, INT64_MAX),
    ],
)
def test_field_int_refuses_a_value_out_of_range_naming_the_field_and_the_range(raw: str, lo: int, hi: int) -> None:
    with pytest.raises(HeaderError, match=rf"'queueId' = -?\d+ is outside \[{lo}, {hi}\]"):
        field_int({"queueId": raw}, "queueId", lo=lo, hi=hi)


def test_field_int_accepts_the_bounds_of_its_range() -> None:
    assert field_int({"n": "0"}, "n", lo=0, hi=7) == 0
    assert field_int({"n": "7"}, "n", lo=0, hi=7) == 7


def test_field_int_quotes_only_the_start_of_a_long_garbage_value() -> None:
    with pytest.raises(HeaderError, match="'n'") as info:
        field_int({"n": "z" * 10_000}, "n")
    assert len(str(info.value)) < 200


def test_field_int_refuses_a_number_too_long_to_parse_without_another_exception() -> None:
    # More digits than int() converts by default: still a clean HeaderError.
    with pytest.raises(HeaderError, match="'n'"):
        field_int({"n": "9" * 5000}, "n")


# --- field_bool ---------------------------------------------------------------------------------
@pytest.mark.parametrize(("raw", "value"), [("true", True), ("TRUE", True), ("True", True), ("1", True)])
def test_field_bool_reads_true(raw: str, value: bool) -> None:
    assert field_bool({"unitMode": raw}, "unitMode") is value


@pytest.mark.parametrize("raw", ["false", "FALSE", "False", "0"])
def test_field_bool_reads_false(raw: str) -> None:
    assert field_bool({"unitMode": raw}, "unitMode", True) is False


@pytest.mark.parametrize("ext", [None, {}, {"unitMode": ""}])
def test_field_bool_returns_the_default_for_a_missing_or_empty_field(ext: dict[str, str] | None) -> None:
    assert field_bool(ext, "unitMode") is False
    assert field_bool(ext, "unitMode", True) is True


@pytest.mark.parametrize("raw", ["yes", "2", "1.0", "t", "truee", "nope"])
def test_field_bool_refuses_garbage_naming_the_field(raw: str) -> None:
    with pytest.raises(HeaderError, match="'unitMode' is not a boolean"):
        field_bool({"unitMode": raw}, "unitMode")


def test_header_error_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="'x'"):
        field_str(None, "x")
