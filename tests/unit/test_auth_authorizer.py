"""data_plane/auth/authorizer.py and request_access.py: authentication of requests (JWT,
RocketMQ ACL signature, none), and every entry of the code → access table."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import jwt
import orjson
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from jwt.algorithms import OKPAlgorithm

from data_plane.auth import authorizer as authorizer_module
from data_plane.auth.authorizer import UNCHECKED, Authorizer, Denial
from data_plane.auth.config import AuthConfig
from data_plane.auth.credential_store import CredentialStore
from data_plane.auth.jwks import JwksCache
from data_plane.auth.jwt_verifier import TokenVerifier
from data_plane.auth.principal import Grant, Principal
from data_plane.auth.request_access import ACCESS, PRIVILEGED, access_of
from data_plane.auth.signature import sign
from data_plane.remoting.codes import RequestCode, ResponseCode
from data_plane.remoting.command import SERIALIZE_ROCKETMQ, RemotingCommand, decode_frame, encode_bytes

NOW = 1_700_000_000.0
SECRET = "sk-abcdef-0123456789"


def tenant(name: str = "acme", grants: list[Grant] | None = None) -> Principal:
    return Principal.build(subject=f"{name}-ak", tenant=name, role="tenant", grants=grants or [], source="access_key")


def full(name: str = "acme") -> Principal:
    return tenant(
        name, [Grant("topic", "*", ["publish", "subscribe", "admin"]), Grant("group", "*", ["subscribe", "admin"])]
    )


OPERATOR = Principal.build(subject="ops", tenant="*", role="operator", source="jwt")
BROKER = Principal.build(subject="broker-a", tenant="*", role="broker", source="access_key")


def cmd(code: int, body: Any = None, **ext: str) -> RemotingCommand:
    raw = orjson.dumps(body) if body is not None and not isinstance(body, bytes) else body
    return RemotingCommand(code, ext_fields=dict(ext) or None, body=raw)


def heartbeat_body(t: str) -> dict[str, Any]:
    return {
        "clientID": "10.0.0.1@1",
        "producerDataSet": [{"groupName": f"{t}%pg"}, {"groupName": "CLIENT_INNER_PRODUCER"}],
        "consumerDataSet": [
            {
                "groupName": f"{t}%g1",
                "consumeType": "CONSUME_PASSIVELY",
                "messageModel": "CLUSTERING",
                "subscriptionDataSet": [
                    {"topic": f"{t}%orders", "subString": "*"},
                    {"topic": f"%RETRY%{t}%g1", "subString": "*"},
                ],
            }
        ],
    }


def lock_body(t: str) -> dict[str, Any]:
    return {
        "consumerGroup": f"{t}%g1",
        "clientId": "c1",
        "mqSet": [
            {"topic": f"{t}%orders", "brokerName": "b", "queueId": 0},
            {"topic": f"{t}%orders", "brokerName": "b", "queueId": 1},
        ],
    }


TOPIC_PUB = Grant("topic", "orders", ["publish"])
TOPIC_SUB = Grant("topic", "orders", ["subscribe"])
TOPIC_ADMIN = Grant("topic", "orders", ["admin"])
GROUP_SUB = Grant("group", "g1", ["subscribe"])
GROUP_ADMIN = Grant("group", "g1", ["admin"])

# (code, request built for a tenant, the grants it needs — each one of them necessary)
Case = tuple[int, Callable[[str], RemotingCommand], list[Grant]]
CASES: dict[str, Case] = {
    "send": (10, lambda t: cmd(10, b"x", producerGroup=f"{t}%pg", topic=f"{t}%orders"), [TOPIC_PUB]),
    "send v2": (310, lambda t: cmd(310, b"x", a=f"{t}%pg", b=f"{t}%orders"), [TOPIC_PUB]),
    "send batch": (320, lambda t: cmd(320, b"x", a=f"{t}%pg", b=f"{t}%orders", m="true"), [TOPIC_PUB]),
    "send batch, v1 names": (320, lambda t: cmd(320, b"x", topic=f"{t}%orders"), [TOPIC_PUB]),
    "pull": (11, lambda t: cmd(11, consumerGroup=f"{t}%g1", topic=f"{t}%orders", queueId="0"), [TOPIC_SUB, GROUP_SUB]),
    "query message": (12, lambda t: cmd(12, topic=f"{t}%orders", key="k"), [TOPIC_SUB]),
    "query message trace": (9002, lambda t: cmd(9002, topic=f"{t}%orders", msgId="k"), [TOPIC_SUB]),
    "query consumer offset": (
        14,
        lambda t: cmd(14, consumerGroup=f"{t}%g1", topic=f"{t}%orders"),
        [TOPIC_SUB, GROUP_SUB],
    ),
    "update consumer offset": (
        15,
        lambda t: cmd(15, consumerGroup=f"{t}%g1", topic=f"{t}%orders"),
        [TOPIC_SUB, GROUP_SUB],
    ),
    "search offset": (29, lambda t: cmd(29, topic=f"{t}%orders", queueId="0"), [TOPIC_SUB]),
    "max offset": (30, lambda t: cmd(30, topic=f"{t}%orders", queueId="0"), [TOPIC_SUB]),
    "min offset": (31, lambda t: cmd(31, topic=f"{t}%orders", queueId="0"), [TOPIC_SUB]),
    "earliest store time": (32, lambda t: cmd(32, topic=f"{t}%orders", queueId="0"), [TOPIC_SUB]),
    "heartbeat": (34, lambda t: cmd(34, heartbeat_body(t)), [TOPIC_SUB, GROUP_SUB]),
    "unregister": (35, lambda t: cmd(35, clientID="c", producerGroup=f"{t}%pg", consumerGroup=f"{t}%g1"), [GROUP_SUB]),
    "send back": (
        36,
        lambda t: cmd(36, group=f"{t}%g1", originTopic=f"{t}%orders", offset="1"),
        [GROUP_SUB, TOPIC_SUB],
    ),
    "consumer list": (38, lambda t: cmd(38, consumerGroup=f"{t}%g1"), [GROUP_SUB]),
    "lock": (41, lambda t: cmd(41, lock_body(t)), [GROUP_SUB, TOPIC_SUB]),
    "unlock": (42, lambda t: cmd(42, lock_body(t)), [GROUP_SUB, TOPIC_SUB]),
    "check client config": (
        46,
        lambda t: cmd(46, {"clientId": "c", "group": f"{t}%g1", "subscriptionData": {"topic": f"{t}%orders"}}),
        [GROUP_SUB, TOPIC_SUB],
    ),
    "route": (105, lambda t: cmd(105, topic=f"{t}%orders"), []),
    "topic stats": (202, lambda t: cmd(202, topic=f"{t}%orders"), [TOPIC_ADMIN]),
    "consume stats": (208, lambda t: cmd(208, consumerGroup=f"{t}%g1", topic=f"{t}%orders"), [GROUP_SUB, TOPIC_SUB]),
    "consume stats, all topics": (208, lambda t: cmd(208, consumerGroup=f"{t}%g1"), [GROUP_SUB]),
    "consumer running info": (307, lambda t: cmd(307, consumerGroup=f"{t}%g1", clientId="c"), [GROUP_ADMIN]),
}
# Topics and groups are made and removed through the control plane (plan limits), not by tenants here.
PRIVILEGED_CODES = [
    21,
    23,
    28,
    43,
    103,
    104,
    106,
    201,
    206,
    39,
    40,
    int(RequestCode.ORBIT_SYNC_TENANCY),
    17,
    200,
    207,
    215,
    216,
]
DEFERRED = {33: lambda: cmd(33, offset="100"), 37: lambda: cmd(37, producerGroup="acme%pg", commitLogOffset="5")}


@pytest.fixture
def auth() -> Authorizer:
    return Authorizer()


@pytest.mark.parametrize("case", sorted(CASES))
def test_table_entry_allows_exactly_its_grants(auth: Authorizer, case: str) -> None:
    code, build, needed = CASES[case]
    req = build("acme")
    assert req.code == code
    assert auth.authorize(tenant("acme", needed), req) is None
    for missing in needed:  # every grant is necessary
        rest = [g for g in needed if g is not missing]
        d = auth.authorize(tenant("acme", rest), req)
        assert d is not None
        assert d.code == ResponseCode.NO_PERMISSION
        assert "no grant covers it" in d.remark
    assert auth.authorize(full("acme"), req) is None


@pytest.mark.parametrize("case", sorted(CASES))
def test_table_entry_refuses_another_tenants_resources(auth: Authorizer, case: str) -> None:
    _, build, _ = CASES[case]
    d = auth.authorize(full("acme"), build("beta"))
    assert d is not None
    assert d.code == ResponseCode.NO_PERMISSION
    assert "tenant 'beta'" in d.remark


@pytest.mark.parametrize("case", sorted(CASES))
def test_operators_and_brokers_may_make_every_request(auth: Authorizer, case: str) -> None:
    _, build, _ = CASES[case]
    assert auth.authorize(OPERATOR, build("beta")) is None
    assert auth.authorize(BROKER, build("acme")) is None


@pytest.mark.parametrize("code", [*PRIVILEGED_CODES, 9999])
def test_listing_cluster_and_internal_codes_are_for_operators_only(auth: Authorizer, code: int) -> None:
    d = auth.authorize(full("acme"), cmd(code, topic="acme%orders"))
    remark = f"request code {code} is for operators only, not a tenant credential"
    assert d == Denial(ResponseCode.NO_PERMISSION, remark)
    assert auth.authorize(OPERATOR, cmd(code)) is None


def test_every_code_the_broker_serves_has_an_entry() -> None:
    served = [10, 310, 320, 11, 34, 35, 38, 41, 42, 46, 17, 215, 21, 200, 201, 207, 14, 15, 30, 31, 29, 32, 33, 12, 28]
    assert [c for c in served if c not in ACCESS] == []
    covered = {c for c, _, _ in CASES.values()} | set(PRIVILEGED_CODES) | set(DEFERRED)
    assert set(ACCESS) <= covered  # and every entry has a test here
    assert access_of(cmd(9999)) is PRIVILEGED


@pytest.mark.parametrize("code", sorted(DEFERRED))
def test_codes_naming_no_topic_are_closed_to_tenants_by_default(auth: Authorizer, code: int) -> None:
    d = auth.authorize(full("acme"), DEFERRED[code]())
    assert d is not None
    assert "names no topic" in d.remark
    assert auth.authorize(OPERATOR, DEFERRED[code]()) is None


def test_deferred_checks_pass_first_then_check_the_stored_topic() -> None:
    auth = Authorizer(deferred_checks=True)
    p = tenant("acme", [TOPIC_SUB])
    assert auth.authorize(p, DEFERRED[33]()) is None
    assert auth.authorize_stored_topic(p, "acme%orders", "subscribe") is None
    d = auth.authorize_stored_topic(p, "beta%orders", "subscribe")
    assert d is not None
    assert "tenant 'beta'" in d.remark
    assert auth.authorize_stored_topic(p, "acme%orders", "publish") is not None
    # END_TRANSACTION: the producer group must be in the namespace, the half message's topic publishable
    assert auth.authorize(p, DEFERRED[37]()) is None
    assert auth.authorize(p, cmd(37, producerGroup="beta%pg")) is not None


# --- names outside a tenant, retry and dead-letter topics ------------------------------------------
def test_unprefixed_and_system_names_are_refused_to_tenants(auth: Authorizer) -> None:
    p = full("acme")
    for req in (
        cmd(310, b="TBW102"),
        cmd(11, consumerGroup="acme%g1", topic="TBW102"),
        cmd(11, consumerGroup="g1", topic="acme%orders"),
        cmd(105, topic="SELF_TEST_TOPIC"),
        cmd(34, {"consumerDataSet": [{"groupName": "g1", "subscriptionDataSet": []}]}),
    ):
        d = auth.authorize(p, req)
        assert d is not None, req
        assert "in no tenant's namespace" in d.remark, req


def test_what_clients_need_implicitly_is_open(auth: Authorizer) -> None:
    nobody = tenant("acme")  # no grants at all
    assert auth.authorize(nobody, cmd(105, topic="TBW102")) is None  # route of the default topic
    producers_only = {
        "clientID": "c",
        "producerDataSet": [{"groupName": "CLIENT_INNER_PRODUCER"}, {"groupName": "acme%pg"}],
    }
    assert auth.authorize(nobody, cmd(34, producers_only)) is None  # a producer's heartbeat
    assert auth.authorize(nobody, cmd(34, {"clientID": "c"})) is None
    assert auth.authorize(nobody, cmd(35, clientID="c", producerGroup="DEFAULT_PRODUCER")) is None
    assert auth.authorize(nobody, cmd(105, topic="%RETRY%acme%g1")) is None
    other = {"clientID": "c", "producerDataSet": [{"groupName": "beta%pg"}]}
    assert auth.authorize(nobody, cmd(34, other)) is not None


def test_a_missing_resource_field_is_refused(auth: Authorizer) -> None:
    d = auth.authorize(full("acme"), cmd(11, consumerGroup="acme%g1"))
    assert d is not None
    assert "(none given)" in d.remark
    assert auth.authorize(full("acme"), cmd(310)) is not None
    assert auth.authorize(full("acme"), cmd(34, {"consumerDataSet": [{"subscriptionDataSet": []}]})) is not None


def test_retry_topics_belong_to_their_group(auth: Authorizer) -> None:
    sub_only = tenant("acme", [GROUP_SUB])
    assert auth.authorize(sub_only, cmd(11, consumerGroup="acme%g1", topic="%RETRY%acme%g1")) is None
    # A consumer sending a message back to its retry topic (stock clients' fallback) is the group's subscribe.
    assert auth.authorize(sub_only, cmd(310, a="CLIENT_INNER_PRODUCER", b="%RETRY%acme%g1")) is None
    assert auth.authorize(sub_only, cmd(310, b="%RETRY%acme%g2")) is not None
    assert auth.authorize(full("acme"), cmd(11, consumerGroup="beta%g1", topic="%RETRY%beta%g1")) is not None


def test_dead_letter_topics_are_read_by_their_group_and_written_by_brokers_only(auth: Authorizer) -> None:
    p = full("acme")
    assert auth.authorize(p, cmd(11, consumerGroup="acme%g1", topic="%DLQ%acme%g1")) is None
    d = auth.authorize(p, cmd(310, b="%DLQ%acme%g1"))
    assert d is not None
    assert "dead-letter" in d.remark
    assert auth.authorize(BROKER, cmd(310, b="%DLQ%acme%g1")) is None


def test_a_malformed_body_is_refused_with_a_clear_remark(auth: Authorizer) -> None:
    for body in (b"{not json", b"[1,2]", orjson.dumps({"consumerDataSet": ["x"]}), b""):
        d = auth.authorize(full("acme"), cmd(34, body))
        assert d is not None
        assert d.remark.startswith("cannot authorize request code 34")
    assert auth.authorize(full("acme"), cmd(41, {"consumerGroup": "acme%g1", "mqSet": "all"})) is not None


def test_fastjson_bodies_with_bare_keys_are_read(auth: Authorizer) -> None:
    body = b'{"consumerGroup":"acme%g1","clientId":"c","mqSet":[{"topic":"acme%orders","brokerName":"b","queueId":0}]}'
    assert auth.authorize(tenant("acme", [GROUP_SUB, TOPIC_SUB]), cmd(41, body)) is None


def test_privileged_principals_are_allowed_without_reading_the_body(auth: Authorizer) -> None:
    assert auth.authorize(OPERATOR, cmd(34, b"{garbage")) is None


# --- the decision cache ---------------------------------------------------------------------------
def test_decisions_are_cached_per_principal_resource_and_action(monkeypatch: pytest.MonkeyPatch) -> None:
    auth = Authorizer()
    calls = 0
    real = authorizer_module._decide

    def counting(*a: Any) -> Denial | None:
        nonlocal calls
        calls += 1
        return real(*a)

    monkeypatch.setattr(authorizer_module, "_decide", counting)
    p = tenant("acme", [TOPIC_PUB])
    for _ in range(100):
        assert auth.authorize(p, cmd(310, b="acme%orders")) is None
        assert auth.authorize(p, cmd(310, b="acme%other")) is not None
    assert calls == 2


def test_the_decision_cache_is_bounded() -> None:
    auth = Authorizer(decision_cache_max=10)
    p = full("acme")
    for i in range(100):
        auth.authorize(p, cmd(310, b=f"acme%t{i}"))
    assert len(auth._decisions) <= 10
    assert auth.authorize(p, cmd(310, b="acme%t0")) is None


def test_listings_can_be_filtered_for_a_tenant(auth: Authorizer) -> None:
    p = tenant("acme", [Grant("topic", "orders-*", ["admin"])])
    names = ["acme%orders-1", "acme%billing", "beta%orders-1", "TBW102", "acme%orders-2"]
    assert auth.filter_names(p, "topic", names, "admin") == ["acme%orders-1", "acme%orders-2"]
    assert auth.filter_names(OPERATOR, "topic", names, "admin") == names


def test_disabled_auth_lets_everything_through() -> None:
    auth = Authorizer(enabled=False)
    assert auth.check(cmd(310, b="beta%x")) is UNCHECKED
    assert auth.authorize(tenant("acme"), cmd(21)) is None


# --- authentication -------------------------------------------------------------------------------
def ed_jwk(kid: str) -> tuple[Ed25519PrivateKey, dict[str, Any]]:
    priv = Ed25519PrivateKey.generate()
    jwk: dict[str, Any] = OKPAlgorithm.to_jwk(priv.public_key(), as_dict=True)
    jwk.update(kid=kid, alg="EdDSA", use="sig")
    return priv, jwk


def token(priv: Ed25519PrivateKey, kid: str, **over: Any) -> str:
    claims: dict[str, Any] = {
        "iss": "orbit",
        "aud": "orbit",
        "sub": "ci_1",
        "tenant": "acme",
        "role": "tenant",
        "grants": [{"resource": "topic", "pattern": "orders", "actions": ["publish"]}],
        "iat": int(NOW),
        "exp": int(NOW) + 600,
        "jti": "j",
    }
    claims.update(over)
    return jwt.encode(claims, priv, algorithm="EdDSA", headers={"kid": kid})


class Source:
    def __init__(self, *jwks: dict[str, Any]) -> None:
        self.doc: dict[str, Any] = {"keys": list(jwks)}
        self.calls = 0

    async def __call__(self) -> Mapping[str, Any]:
        self.calls += 1
        return self.doc


def store_with(*entries: dict[str, Any]) -> CredentialStore:
    s = CredentialStore()
    s.replace_all(entries, 1)  # type: ignore[arg-type]
    return s


def ak_entry(ak: str = "AK1", **over: Any) -> dict[str, Any]:
    e = {
        "access_key": ak,
        "tenant": "acme",
        "role": "tenant",
        "secret": SECRET,
        "status": "active",
        "grants": [{"resource": "topic", "pattern": "orders", "actions": ["publish"]}],
    }
    e.update(over)
    return e


def signed(req: RemotingCommand, ak: str = "AK1", secret: str = SECRET) -> RemotingCommand:
    ext = {**(req.ext_fields or {}), "AccessKey": ak, "OnsChannel": "ALIYUN"}
    ext["Signature"] = sign(ext, req.body_bytes(), secret)
    req.ext_fields = ext
    return req


@pytest.fixture
def keys() -> tuple[Ed25519PrivateKey, JwksCache, Source]:
    priv, jwk = ed_jwk("k1")
    source = Source(jwk)
    cache = JwksCache(fetcher=source, unknown_kid_min_interval_s=30)
    cache.set_jwks(source.doc)
    return priv, cache, source


@pytest.fixture
def full_auth(keys: tuple[Ed25519PrivateKey, JwksCache, Source]) -> Authorizer:
    _, cache, _ = keys
    return Authorizer(
        verifier=TokenVerifier(cache, clock_s=lambda: NOW),
        credentials=store_with(ak_entry(), ak_entry("AK2", status="revoked", secret="")),
        jwks=cache,
    )


def remark_of(result: object) -> str:
    assert isinstance(result, Denial), result
    assert result.code == ResponseCode.NO_PERMISSION
    return result.remark


def test_a_bearer_token_authenticates(full_auth: Authorizer, keys: Any) -> None:
    req = cmd(310, b"x", b="acme%orders", Authorization=f"Bearer {token(keys[0], 'k1')}")
    p = full_auth.check(req)
    assert isinstance(p, Principal)
    assert p.source == "jwt"
    assert p.tenant == "acme"


def test_a_signed_request_authenticates(full_auth: Authorizer) -> None:
    p = full_auth.check(signed(cmd(310, b"payload", b="acme%orders", e="1")))
    assert isinstance(p, Principal)
    assert p.source == "access_key"
    assert p.subject == "AK1"


@pytest.mark.parametrize("serialize_type", [0, SERIALIZE_ROCKETMQ])
def test_a_signature_survives_the_wire(full_auth: Authorizer, serialize_type: int) -> None:
    req = signed(cmd(310, b"payload", b="acme%orders", e="1", g="1700000000000"))
    req.serialize_type = serialize_type
    frame = encode_bytes(req)
    back = decode_frame(memoryview(frame)[4:])
    assert isinstance(full_auth.check(back), Principal)


def test_a_json_number_in_ext_fields_is_signed_as_its_text(full_auth: Authorizer) -> None:
    """Stock clients sign strings but some send numbers; decoding turns them back into text."""
    ext = {"b": "acme%orders", "e": "1", "AccessKey": "AK1"}
    ext["Signature"] = sign(ext, b"p", SECRET)
    header = orjson.dumps({"code": 310, "flag": 0, "opaque": 1, "version": 399, "extFields": {**ext, "e": 1}})
    frame = len(header).to_bytes(4, "big") + header + b"p"
    assert isinstance(full_auth.check(decode_frame(frame)), Principal)


@pytest.mark.parametrize(
    ("mutate", "remark"),
    [
        (lambda r: r.ext_fields.update(Signature="AAAA"), "signature does not match"),
        (lambda r: setattr(r, "body", b"other"), "signature does not match"),
        (lambda r: r.ext_fields.update(b="acme%other"), "signature does not match"),
        (lambda r: r.ext_fields.pop("Signature"), "the request has an AccessKey but no Signature"),
        (lambda r: r.ext_fields.update(AccessKey="AK9"), "unknown access key"),
        (lambda r: r.ext_fields.update(AccessKey="AK2"), "access key revoked"),
    ],
)
def test_bad_signatures_are_refused_with_a_clear_remark(full_auth: Authorizer, mutate: Any, remark: str) -> None:
    req = signed(cmd(310, b"payload", b="acme%orders"))
    mutate(req)
    assert remark_of(full_auth.check(req)) == remark


def test_requests_without_credentials_are_refused(full_auth: Authorizer) -> None:
    assert remark_of(full_auth.check(cmd(310, b="acme%orders"))).startswith("no credentials")
    assert remark_of(full_auth.check(cmd(34, {"clientID": "c"}))).startswith("no credentials")


def test_a_malformed_authorization_field_is_refused(full_auth: Authorizer) -> None:
    assert "not 'Bearer <token>'" in remark_of(full_auth.check(cmd(310, b="acme%orders", Authorization="Basic x")))
    assert remark_of(full_auth.check(cmd(310, Authorization="Bearer nope"))) == "token is not a well-formed JWT"


def test_an_expired_token_says_so(full_auth: Authorizer, keys: Any) -> None:
    req = cmd(310, b="acme%orders", Authorization=f"Bearer {token(keys[0], 'k1', exp=int(NOW) - 3600)}")
    assert remark_of(full_auth.check(req)) == "token expired"


def test_an_authenticated_request_outside_its_grants_is_denied(full_auth: Authorizer, keys: Any) -> None:
    req = cmd(310, b="acme%billing", Authorization=f"Bearer {token(keys[0], 'k1')}")
    assert "may not publish topic 'billing'" in remark_of(full_auth.check(req))


def test_servers_without_a_verifier_or_a_store_refuse_that_kind() -> None:
    auth = Authorizer()
    assert remark_of(auth.check(cmd(310, Authorization="Bearer x"))) == "tokens are not accepted by this server"
    assert remark_of(auth.check(cmd(310, AccessKey="AK1"))) == "access keys are not accepted by this server"


@pytest.mark.asyncio
async def test_an_unknown_kid_triggers_one_refresh_then_verifies(full_auth: Authorizer, keys: Any) -> None:
    _, _cache, source = keys
    priv2, jwk2 = ed_jwk("k2")
    source.doc = {"keys": [*source.doc["keys"], jwk2]}  # the control plane rotated
    result = full_auth.check(cmd(310, b="acme%orders", Authorization=f"Bearer {token(priv2, 'k2')}"))
    assert inspect.isawaitable(result)
    p = await result
    assert isinstance(p, Principal)
    assert source.calls == 1
    assert isinstance(
        full_auth.check(cmd(310, b="acme%orders", Authorization=f"Bearer {token(priv2, 'k2')}")), Principal
    )


@pytest.mark.asyncio
async def test_made_up_kids_are_refused_after_at_most_one_refresh(full_auth: Authorizer) -> None:
    forger, _ = ed_jwk("evil")
    first = full_auth.check(cmd(310, b="acme%orders", Authorization=f"Bearer {token(forger, 'evil')}"))
    assert inspect.isawaitable(first)
    assert "unknown key id 'evil'" in remark_of(await first)
    again = full_auth.check(cmd(310, b="acme%orders", Authorization=f"Bearer {token(forger, 'evil2')}"))
    assert "unknown key id 'evil2'" in remark_of(again)  # rate-limited: refused at once, no refresh


@pytest.mark.asyncio
async def test_from_config_builds_a_working_authorizer(tmp_path: Path) -> None:
    priv, jwk = ed_jwk("k1")
    config = AuthConfig.for_store_dir(str(tmp_path), enabled=True, jwks_url="http://unused.invalid/jwks").validate()
    seed_store = CredentialStore(config.credential_store_path, key_path=config.credential_key_path)
    seed_store.replace_all([ak_entry()], 3)  # type: ignore[list-item]
    source = Source(jwk)
    auth = Authorizer.from_config(config, jwks_fetcher=source, clock_s=lambda: NOW)
    await auth.start()
    try:
        assert auth.credentials is not None
        assert auth.credentials.version == 3
        assert isinstance(auth.check(signed(cmd(310, b"p", b="acme%orders"))), Principal)
        assert isinstance(auth.check(cmd(310, b="acme%orders", Authorization=f"Bearer {token(priv, 'k1')}")), Principal)
        assert (tmp_path / "config" / "auth" / "jwks.json").exists()
    finally:
        await auth.stop()


def test_auth_config_validation() -> None:
    with pytest.raises(ValueError, match="neither jwks_url nor credential_store_path"):
        AuthConfig(enabled=True).validate()
    with pytest.raises(ValueError, match="token_leeway_s must be >= 0"):
        AuthConfig(token_leeway_s=-1).validate()


def test_denial_answers_no_permission_with_its_remark() -> None:
    req = cmd(310, b="x")
    req.opaque = 42
    resp = Denial(ResponseCode.NO_PERMISSION, "token expired").response(req)
    assert (resp.code, resp.remark, resp.opaque, resp.is_response) == (16, "token expired", 42, True)


def test_check_costs_no_io_for_a_cached_token(full_auth: Authorizer, keys: Any) -> None:
    req = cmd(310, b="acme%orders", Authorization=f"Bearer {token(keys[0], 'k1')}")
    first = full_auth.check(req)
    for _ in range(1000):
        assert full_auth.check(req) is first
    assert not asyncio.iscoroutine(first)
