"""Grants: parsing, matching and the namespace-admin rule; tenant and resource names."""

from __future__ import annotations

import pytest

from control_plane.errors import InvalidField
from control_plane.grants import Grant, allows, default_grants, grants_to_json, is_tenant_admin, parse_grants
from data_plane.tenancy.namespace import dlq_topic, retry_topic, valid_name, valid_tenant, wire_name


def test_tenant_ids_and_names_follow_the_shared_contract() -> None:
    assert valid_tenant("acme")
    assert valid_tenant("a-1-b")
    for bad in ("ab", "Acme", "1acme", "acme-", "a" * 33, "ac%me", "acme'--"):
        assert not valid_tenant(bad), bad
    assert valid_name("Orders_2024-x")
    assert valid_name("a" * 64)
    for bad in ("", "a" * 65, "or%ders", "or ders", "x'; DROP TABLE topics;--"):
        assert not valid_name(bad), bad


def test_wire_names() -> None:
    assert wire_name("acme", "orders") == "acme%orders"
    assert retry_topic("acme", "billing") == "%RETRY%acme%billing"
    assert dlq_topic("acme", "billing") == "%DLQ%acme%billing"


def test_patterns_match_names_prefixes_and_everything() -> None:
    exact = Grant("topic", "orders", frozenset({"publish"}))
    prefix = Grant("topic", "orders-*", frozenset({"subscribe"}))
    every = Grant("group", "*", frozenset({"admin"}))
    assert exact.matches("topic", "orders")
    assert not exact.matches("topic", "orders-eu")
    assert prefix.matches("topic", "orders-eu")
    assert not prefix.matches("topic", "orders")
    assert every.matches("group", "anything")
    assert not every.matches("topic", "anything")
    grants = [exact, prefix, every]
    assert allows(grants, "topic", "orders", "publish")
    assert not allows(grants, "topic", "orders", "subscribe")
    assert allows(grants, "topic", "orders-eu", None)


def test_default_grants_are_namespace_admin_and_round_trip() -> None:
    grants = default_grants()
    assert is_tenant_admin(grants)
    assert parse_grants(list(grants_to_json(grants))) == grants
    assert not is_tenant_admin([Grant("topic", "*", frozenset({"admin"}))])


@pytest.mark.parametrize(
    "value",
    [
        "topic:*",
        [{"resource": "queue", "pattern": "*", "actions": ["publish"]}],
        [{"resource": "topic", "pattern": "other%orders", "actions": ["publish"]}],
        [{"resource": "topic", "pattern": "a*b", "actions": ["publish"]}],
        [{"resource": "topic", "pattern": "*", "actions": []}],
        [{"resource": "topic", "pattern": "*", "actions": ["delete"]}],
        [{"resource": "topic", "pattern": "*", "actions": ["publish"], "extra": 1}],
    ],
)
def test_bad_grants_are_refused_naming_the_field(value: object) -> None:
    with pytest.raises(InvalidField) as e:
        parse_grants(value)
    assert e.value.field.startswith("grants")
