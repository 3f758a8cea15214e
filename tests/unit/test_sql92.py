"""data_plane/filter/sql92.py: parsing, three-valued evaluation, errors with positions, fuzzing."""

from __future__ import annotations

import contextlib
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from data_plane.filter.sql92 import (
    MAX_DEPTH,
    PredicateCache,
    SqlParseError,
    compile_sql92,
    record_properties,
    validate,
)
from data_plane.store.message import encode_properties


def ok(expr: str, props: dict[str, str]) -> bool:
    return compile_sql92(expr)(props)


@pytest.mark.parametrize(
    ("expr", "props", "expected"),
    [
        ("a > 5", {"a": "6"}, True),
        ("a > 5", {"a": "5"}, False),
        ("a >= 5", {"a": "5"}, True),
        ("a < 5.5", {"a": "5.25"}, True),
        ("a <= -1", {"a": "-1"}, True),
        ("a = 5", {"a": "5.0"}, True),
        ("a <> 5", {"a": "6"}, True),
        ("a != 5", {"a": "5"}, False),
        ("b = 'x'", {"b": "x"}, True),
        ("b = 'it''s'", {"b": "it's"}, True),
        ("b <> 'x'", {"b": "y"}, True),
        ("a BETWEEN 1 AND 3", {"a": "3"}, True),
        ("a NOT BETWEEN 1 AND 3", {"a": "4"}, True),
        ("c IN ('x', 'y')", {"c": "y"}, True),
        ("c NOT IN ('x', 'y')", {"c": "z"}, True),
        ("c IS NULL", {}, True),
        ("c IS NOT NULL", {"c": ""}, True),
        ("flag = TRUE", {"flag": "true"}, True),
        ("flag = FALSE", {"flag": "TRUE"}, False),
        ("TRUE", {}, True),
        ("FALSE OR a = 1", {"a": "1"}, True),
        ("a > 5 AND b = 'x'", {"a": "9", "b": "x"}, True),
        ("a > 5 AND b = 'x'", {"a": "9", "b": "y"}, False),
        ("(a > 5 OR b = 'x') AND NOT c = 1", {"a": "1", "b": "x", "c": "2"}, True),
        ("TAGS IN ('TagA') AND a BETWEEN 4 AND 7", {"TAGS": "TagA", "a": "5"}, True),
        ("a > 1e3", {"a": "1001"}, True),
        ("a = 10L", {"a": "10"}, True),
        ("and_x = 1 and OR_y = 2", {"and_x": "1", "OR_y": "2"}, True),
        ("user.id = 'u1'", {"user.id": "u1"}, True),
    ],
)
def test_expressions_evaluate_as_rocketmq_does(expr: str, props: dict[str, str], expected: bool) -> None:
    assert ok(expr, props) is expected


@pytest.mark.parametrize(
    "expr",
    ["a > 5", "a = 5", "a <> 5", "a BETWEEN 1 AND 2", "a IN ('x')", "b = 'x'", "NOT a > 5", "NOT a IN ('x')"],
)
def test_a_missing_property_makes_every_comparison_unknown_and_unknown_is_not_delivered(expr: str) -> None:
    pred = compile_sql92(expr)
    assert pred.evaluate({}) is None
    assert pred({}) is False


def test_kleene_logic_for_and_or_with_unknown() -> None:
    assert compile_sql92("a = 1 OR b = 1").evaluate({"b": "1"}) is True
    assert compile_sql92("a = 1 OR b = 1").evaluate({"b": "2"}) is None
    assert compile_sql92("a = 1 AND b = 1").evaluate({"b": "2"}) is False
    assert compile_sql92("a = 1 AND b = 1").evaluate({"b": "1"}) is None


def test_a_value_that_is_not_a_number_makes_a_numeric_comparison_unknown() -> None:
    assert compile_sql92("a > 5").evaluate({"a": "lots"}) is None
    assert compile_sql92("a = 5").evaluate({"a": "five"}) is None
    assert compile_sql92("a = '5'")({"a": "5"}) is True  # a string literal compares as a string
    assert compile_sql92("a = '5'")({"a": "5.0"}) is False


@pytest.mark.parametrize(
    ("expr", "position", "words"),
    [
        ("", 0, "empty"),
        ("a >", 3, "expected a property name"),
        ("a > 'x'", 4, "cannot be compared"),
        ("a", 1, "expected a comparison"),
        ("(a = 1", 6, "expected ')'"),
        ("a = 1 b", 6, "unexpected 'b'"),
        ("a IN (1)", 6, "string literals only"),
        ("a = NULL", 4, "IS NULL"),
        ("a # 1", 2, "unexpected character '#'"),
        ("a = 'x", 4, "unterminated string"),
        ("a = 1 AND", 9, "expected a property name"),
        ("a NOT 5", 6, "BETWEEN or IN"),
        ("a = 'x' AND b = 1 OR c BETWEEN 'a' AND 2", 31, "cannot be compared"),
        ("x = TRUE OR 'a' = 1", 16, "string cannot be compared with a number"),
    ],
)
def test_bad_expressions_are_refused_naming_the_position(expr: str, position: int, words: str) -> None:
    with pytest.raises(SqlParseError) as info:
        compile_sql92(expr)
    assert info.value.position == position, str(info.value)
    assert words in str(info.value)
    assert f"position {position}" in str(info.value)
    assert validate(expr) == str(info.value)


def test_nesting_is_bounded() -> None:
    with pytest.raises(SqlParseError, match="nests deeper"):
        compile_sql92("(" * (MAX_DEPTH + 5) + "a = 1" + ")" * (MAX_DEPTH + 5))
    with pytest.raises(SqlParseError, match="nests deeper"):
        compile_sql92("NOT " * (MAX_DEPTH + 5) + "a = 1")
    assert compile_sql92("(" * 10 + "a = 1" + ")" * 10)({"a": "1"})


def test_record_properties_reads_the_commit_log_layout() -> None:
    props = {"a": "7", "TAGS": "t", "UNIQ_KEY": "ABC"}
    body = b"hello"
    topic = b"T1"
    raw_props = encode_properties(props)
    header = struct.pack(">iiIiiqqiq8sq8siqi", 0, 0, 0, 0, 0, 0, 0, 0, 0, b"\0" * 8, 0, b"\0" * 8, 0, 0, len(body))
    record = header + body + bytes([len(topic)]) + topic + struct.pack(">h", len(raw_props)) + raw_props
    assert record_properties(memoryview(record)) == props
    assert compile_sql92("a > 5").matches_record(memoryview(record))
    assert record_properties(memoryview(record[:90])) is None


def test_the_cache_compiles_once_per_group_topic_and_expression() -> None:
    cache = PredicateCache(max_entries=2)
    p1 = cache.get("g", "t", "a = 1")
    assert cache.get("g", "t", "a = 1") is p1
    cache.get("g", "t", "a = 2")
    cache.get("g", "t", "a = 3")
    assert len(cache) == 2
    with pytest.raises(SqlParseError):
        cache.get("g", "t", "a =")
    assert len(cache) == 2


_ALPHABET = st.sampled_from(
    [
        *"abcxyz019 .'()=<>!,-+_$#\\\t\n",
        "AND",
        "OR",
        "NOT",
        "IN",
        "IS",
        "NULL",
        "BETWEEN",
        "TRUE",
        "FALSE",
        " a ",
        "'s'",
        "1e5",
        "é",
    ]
)


@settings(max_examples=400, deadline=None, print_blob=True)
@given(st.lists(_ALPHABET, max_size=30).map("".join))
def test_random_token_soup_only_ever_raises_the_parse_error(text: str) -> None:
    try:
        pred = compile_sql92(text)
    except SqlParseError as e:
        position = e.position
    else:
        # Whatever compiled evaluates without raising, on any properties.
        for props in ({}, {"a": "1", "b": "x", "c": "NaN", "x": "true"}, {"a": "", "z": "1e400"}):
            assert pred(props) in (True, False)
        return
    assert 0 <= position <= len(text)


@settings(max_examples=300, deadline=None, print_blob=True)
@given(st.text(max_size=60))
def test_random_unicode_only_ever_raises_the_parse_error(text: str) -> None:
    with contextlib.suppress(SqlParseError):
        compile_sql92(text)


@settings(max_examples=200, deadline=None, print_blob=True)
@given(st.integers(-(10**6), 10**6), st.integers(-(10**6), 10**6))
def test_numeric_comparisons_agree_with_python(a: int, b: int) -> None:
    props = {"a": str(a)}
    assert ok(f"a > {b}", props) is (a > b)
    assert ok(f"a <= {b}", props) is (a <= b)
    assert ok(f"a = {b}", props) is (a == b)
    assert ok(f"a BETWEEN {min(a, b)} AND {max(a, b)}", props) is True
