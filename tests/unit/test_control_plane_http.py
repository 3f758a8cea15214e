"""The HTTP layer without a server: error codes, the OpenAPI document, body field parsing."""

from __future__ import annotations

import re

import pytest

from control_plane.app import ALL_ROUTES
from control_plane.errors import CODES, ControlPlaneError, InvalidField, InvalidRequest, QuotaExceeded, TopicNotFound
from control_plane.openapi import build_document
from control_plane.request_body import BIGINT_FIELD_MAX, INTEGER_MAX, Body, check_text, refuse_nul

pytestmark = pytest.mark.unit


def test_every_error_code_is_stable_unique_and_snake_case() -> None:
    classes = list(CODES.values())
    assert len({c.code for c in classes}) == len(classes)
    assert all(re.fullmatch(r"[a-z][a-z_]+", code) for code in CODES)
    assert all(400 <= c.status <= 599 for c in classes)
    assert CODES["topic_not_found"] is TopicNotFound
    assert CODES["internal_error"] is ControlPlaneError


def test_errors_carry_their_data() -> None:
    e = QuotaExceeded("max_topics", allowed=5, requested=6)
    assert e.status == 422
    assert e.body() == {
        "error": {
            "code": "quota_exceeded",
            "message": "plan limit max_topics is 5; this request needs 6",
            "details": {"limit": "max_topics", "allowed": 5, "requested": 6},
        }
    }


def test_the_openapi_document_has_one_operation_per_route() -> None:
    doc = build_document(ALL_ROUTES)
    ops = [(m, p) for p, methods in doc["paths"].items() for m in methods]
    assert len(ops) == len(set(ops)) == len(ALL_ROUTES)
    topic = doc["paths"]["/v1/tenants/{tenant}/topics/{name}"]["get"]
    assert [p["name"] for p in topic["parameters"]] == ["tenant", "name"]
    assert topic["security"] == [{"bearer": []}]
    assert doc["paths"]["/healthz"]["get"]["security"] == []
    create = doc["paths"]["/v1/tenants/{tenant}/topics"]["post"]
    assert create["requestBody"]["content"]["application/json"]["schema"]["required"] == ["name"]
    assert {"200", "201", "409", "413", "422"} <= set(create["responses"])


def test_body_fields_are_typed_and_bounded() -> None:
    body = Body({"n": 5, "b": True, "t": "hi", "flag": 1}, allowed=("n", "b", "t", "flag", "missing"))
    assert body.integer("n", maximum=10) == 5
    assert body.boolean("b") is True
    assert body.text("t") == "hi"
    assert body.text("missing", default="d") == "d"
    with pytest.raises(InvalidField, match="'b': must be an integer"):
        body.integer("b")  # JSON true is not 1
    with pytest.raises(InvalidField, match="true or false"):
        body.boolean("flag")
    with pytest.raises(InvalidField, match=r"within 6\.\.10"):
        body.integer("n", minimum=6, maximum=10)
    with pytest.raises(InvalidField, match="is required"):
        body.required_integer("missing")
    with pytest.raises(InvalidRequest, match="unknown fields: x"):
        Body({"x": 1}, allowed=())


def test_free_text_takes_quotes_but_not_control_characters() -> None:
    assert check_text("d", "O'Brien; DROP TABLE x; --") == "O'Brien; DROP TABLE x; --"
    for bad in ("a\x00b", "line\nbreak", "x" * 257):
        with pytest.raises(InvalidField):
            check_text("d", bad)


def test_integers_are_bounded_by_their_column_and_nul_is_refused_at_any_depth() -> None:
    body = Body({"n": INTEGER_MAX, "big": INTEGER_MAX + 1}, allowed=("n", "big"))
    assert body.integer("n") == INTEGER_MAX  # the default bound is PostgreSQL integer's
    with pytest.raises(InvalidField, match=r"'big': must be within 0\.\.2147483647"):
        body.integer("big")
    assert body.integer("big", maximum=BIGINT_FIELD_MAX) == INTEGER_MAX + 1
    refuse_nul({"a": [{"b": "ok"}], "c": 1})
    with pytest.raises(InvalidField, match=r"'a\[1\]\.b': must not contain NUL"):
        refuse_nul({"a": [{"b": "ok"}, {"b": "x\x00"}]})
    with pytest.raises(InvalidField, match="names must not contain NUL"):
        refuse_nul({"a": {"k\x00": 1}})
