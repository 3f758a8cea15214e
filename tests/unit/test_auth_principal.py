"""data_plane/auth/principal.py (grants and principals) and the tenant and name rules and wire names
of data_plane/tenancy/namespace.py."""

from __future__ import annotations

import pytest

from data_plane.auth.principal import AuthConfigError, Grant, Principal, parse_grants
from data_plane.tenancy.namespace import dlq_topic, parse_wire_name, retry_topic, valid_name, valid_tenant, wire_name


@pytest.mark.parametrize("tenant", ["acme", "a1b", "ab-c", "a" + "b" * 30 + "c"])
def test_valid_tenant_ids_are_accepted(tenant: str) -> None:
    assert valid_tenant(tenant)


@pytest.mark.parametrize("tenant", ["ab", "Acme", "1acme", "acme-", "ac_me", "a" + "b" * 31 + "c", "", "ac%me"])
def test_invalid_tenant_ids_are_refused(tenant: str) -> None:
    assert not valid_tenant(tenant)


def test_names_allow_letters_digits_underscore_and_dash_up_to_64() -> None:
    assert valid_name("Orders_2024-eu")
    assert valid_name("x" * 64)
    assert not valid_name("x" * 65)
    assert not valid_name("a%b")
    assert not valid_name("")


def test_wire_names_split_into_tenant_and_name() -> None:
    assert parse_wire_name(wire_name("acme", "orders")) == ("", "acme", "orders")
    assert parse_wire_name(retry_topic("acme", "g1")) == ("RETRY", "acme", "g1")
    assert parse_wire_name(dlq_topic("acme", "g1")) == ("DLQ", "acme", "g1")


@pytest.mark.parametrize(
    "wire", ["TBW102", "orders", "", "%RETRY%g1", "Acme%orders", "acme%", "acme%a%b", "%SYS%acme%x"]
)
def test_names_without_a_valid_tenant_prefix_belong_to_no_tenant(wire: str) -> None:
    w = parse_wire_name(wire)
    assert w.tenant is None
    assert w.name == wire


def test_grant_patterns_match_exact_prefix_and_star() -> None:
    exact = Grant("topic", "orders", ["publish"])
    prefix = Grant("topic", "orders-*", ["publish", "subscribe"])
    star = Grant("group", "*", ["subscribe"])
    assert exact.matches("topic", "orders", "publish")
    assert not exact.matches("topic", "orders-eu", "publish")
    assert not exact.matches("topic", "orders", "subscribe")
    assert not exact.matches("group", "orders", "publish")
    assert prefix.matches("topic", "orders-eu", "subscribe")
    assert prefix.matches("topic", "orders-", "publish")
    assert not prefix.matches("topic", "orders", "publish")
    assert star.matches("group", "anything", "subscribe")
    assert not star.matches("group", "anything", "admin")


@pytest.mark.parametrize(
    "raw",
    [
        {"resource": "queue", "pattern": "*", "actions": ["publish"]},
        {"resource": "topic", "pattern": "acme%orders", "actions": ["publish"]},
        {"resource": "topic", "pattern": "or*ders", "actions": ["publish"]},
        {"resource": "topic", "pattern": "orders", "actions": []},
        {"resource": "topic", "pattern": "orders", "actions": ["write"]},
        {"resource": "topic", "pattern": "orders", "actions": "publish"},
        {"resource": "topic", "actions": ["publish"]},
    ],
)
def test_malformed_grants_are_refused(raw: dict[str, object]) -> None:
    with pytest.raises(AuthConfigError):
        parse_grants([raw])


def test_grants_round_trip_through_json_form() -> None:
    g = Grant("topic", "orders-*", ["subscribe", "publish"])
    assert Grant.from_dict(g.to_dict()) == g
    assert g.to_dict() == {"resource": "topic", "pattern": "orders-*", "actions": ["publish", "subscribe"]}


def test_principals_are_validated_by_role() -> None:
    p = Principal.build(subject="ak", tenant="acme", role="tenant", source="access_key")
    assert not p.is_privileged
    op = Principal.build(subject="ops", tenant="*", role="operator", source="jwt")
    assert op.is_privileged
    assert op.allows("topic", "x", "admin")
    with pytest.raises(AuthConfigError):
        Principal.build(subject="ak", tenant="*", role="tenant", source="jwt")
    with pytest.raises(AuthConfigError):
        Principal.build(subject="ak", tenant="acme", role="operator", source="jwt")
    with pytest.raises(AuthConfigError):
        Principal.build(subject="ak", tenant="acme", role="root", source="jwt")
    with pytest.raises(AuthConfigError):
        Principal.build(subject="", tenant="acme", role="tenant", source="jwt")


def test_principals_hash_by_identity() -> None:
    a = Principal.build(subject="ak", tenant="acme", role="tenant", source="jwt")
    b = Principal.build(subject="ak", tenant="acme", role="tenant", source="jwt")
    assert a != b
    assert len({a, b, a}) == 2
