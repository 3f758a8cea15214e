"""The HA link's authentication without sockets: the CHALLENGE / SLAVE_PROOF / MASTER_PROOF frames
and their checks (wrong secret, wrong group, replay, reflection, tampering), the broker's secret
(ha_secret_file, the control plane's kept sealed), the control plane's derivation, and the bound
on a slave's SLAVE_OFFSETS (unknown topics, queues and groups ignored; offsets clamped)."""

from __future__ import annotations

import base64
import collections
import os
import random
import stat
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import orjson
import pytest

from control_plane.reconcile_source import ha_link_secret
from control_plane.settings import MasterKey
from data_plane.broker.config import BrokerConfig, ConfigError
from data_plane.broker.consumer_offset import ConsumerOffsetManager
from data_plane.broker.ha_link import LinkSecret, decode_ha_secret, read_secret_file
from data_plane.broker.replication import Replication
from data_plane.broker.subscription_group import SubscriptionGroupManager
from data_plane.broker.tenancy import TenancyError, parse_snapshot
from data_plane.broker.topic_config import TopicConfigManager
from data_plane.store.ha.protocol import (
    AUTH_HMAC,
    AUTH_NONE,
    CHALLENGE,
    MAGIC,
    MASTER_PROOF,
    SLAVE_PROOF,
    VERSION,
    ProtocolError,
    check_master_proof,
    check_slave_proof,
    decode_challenge,
    encode_challenge,
    encode_slave_proof,
    master_proof,
    new_nonce,
    slave_proof,
)
from tests.conftest import counter_points

SECRET = b"s3cret-of-broker-a-0123456789abcdef"
GROUP = "broker-a"


# --- frames --------------------------------------------------------------------------------------
def test_frame_layouts() -> None:
    assert (CHALLENGE.size, SLAVE_PROOF.size, MASTER_PROOF.size) == (44, 64, 32)
    nonce = bytes(range(32))
    frame = encode_challenge(AUTH_HMAC, nonce)
    assert frame[:4] == b"ORHA"
    assert MAGIC == 0x4F524841
    assert frame[4:8] == VERSION.to_bytes(4, "big")
    assert VERSION == 3
    assert frame[8:12] == AUTH_HMAC.to_bytes(4, "big")
    assert frame[12:] == nonce
    assert decode_challenge(frame) == (AUTH_HMAC, nonce)
    assert decode_challenge(encode_challenge(AUTH_NONE, nonce)) == (AUTH_NONE, nonce)
    proof = encode_slave_proof(SECRET, GROUP, nonce, b"\x01" * 32)
    assert proof[:32] == b"\x01" * 32
    assert proof[32:] == slave_proof(SECRET, GROUP, nonce, b"\x01" * 32)


@pytest.mark.parametrize(
    "frame",
    [
        CHALLENGE.pack(0x12345678, VERSION, AUTH_HMAC, bytes(32)),  # another protocol
        CHALLENGE.pack(MAGIC, 1, AUTH_HMAC, bytes(32)),  # the unauthenticated protocol version
        CHALLENGE.pack(MAGIC, VERSION, 7, bytes(32)),  # an unknown mode
    ],
)
def test_a_challenge_of_another_protocol_is_refused(frame: bytes) -> None:
    with pytest.raises(ProtocolError):
        decode_challenge(frame)


def test_the_whole_exchange_checks_out_with_the_groups_secret() -> None:
    m_nonce = new_nonce()
    s_nonce = new_nonce()
    assert m_nonce != s_nonce
    assert len(m_nonce) == 32
    checked = check_slave_proof(SECRET, GROUP, m_nonce, encode_slave_proof(SECRET, GROUP, m_nonce, s_nonce))
    assert checked is not None
    got_nonce, reply = checked
    assert got_nonce == s_nonce
    assert reply == master_proof(SECRET, GROUP, m_nonce, s_nonce)
    assert check_master_proof(SECRET, GROUP, m_nonce, s_nonce, reply)


def test_a_proof_made_with_another_secret_or_group_is_refused() -> None:
    m_nonce, s_nonce = new_nonce(), new_nonce()
    other = b"another secret 0123456"
    assert check_slave_proof(SECRET, GROUP, m_nonce, encode_slave_proof(other, GROUP, m_nonce, s_nonce)) is None
    assert check_slave_proof(SECRET, GROUP, m_nonce, encode_slave_proof(SECRET, "broker-b", m_nonce, s_nonce)) is None
    # The slave's check of a master without the secret.
    assert not check_master_proof(SECRET, GROUP, m_nonce, s_nonce, master_proof(b"wrong" * 8, GROUP, m_nonce, s_nonce))
    assert not check_master_proof(SECRET, GROUP, m_nonce, s_nonce, master_proof(SECRET, "broker-b", m_nonce, s_nonce))


def test_a_replayed_proof_answers_no_other_challenge() -> None:
    seed = random.randrange(2**32)
    print(f"seed {seed}")
    rng = random.Random(seed)
    for _ in range(200):
        first, second = rng.randbytes(32), rng.randbytes(32)
        captured = encode_slave_proof(SECRET, GROUP, first, rng.randbytes(32))
        assert check_slave_proof(SECRET, GROUP, first, captured) is not None
        assert check_slave_proof(SECRET, GROUP, second, captured) is None


def test_a_masters_proof_cannot_stand_in_for_a_slaves() -> None:
    m_nonce, s_nonce = new_nonce(), new_nonce()
    reflected = SLAVE_PROOF.pack(s_nonce, master_proof(SECRET, GROUP, m_nonce, s_nonce))
    assert check_slave_proof(SECRET, GROUP, m_nonce, reflected) is None
    # nor the challenge's own nonce sent back as the slave's
    own = encode_slave_proof(SECRET, GROUP, m_nonce, m_nonce)
    assert check_slave_proof(SECRET, GROUP, m_nonce, own) is None
    # and a slave's proof is not a master's
    assert not check_master_proof(SECRET, GROUP, m_nonce, s_nonce, slave_proof(SECRET, GROUP, m_nonce, s_nonce))


def test_any_flipped_bit_of_a_proof_is_refused() -> None:
    seed = random.randrange(2**32)
    print(f"seed {seed}")
    rng = random.Random(seed)
    m_nonce, s_nonce = rng.randbytes(32), rng.randbytes(32)
    good = encode_slave_proof(SECRET, GROUP, m_nonce, s_nonce)
    for bit in rng.sample(range(len(good) * 8), 64):
        bad = bytearray(good)
        bad[bit // 8] ^= 1 << (bit % 8)
        assert check_slave_proof(SECRET, GROUP, m_nonce, bytes(bad)) is None, bit


# --- the broker's secret -------------------------------------------------------------------------
def secret_file(tmp_path: Path, content: bytes = SECRET + b"\n", mode: int = 0o600) -> str:
    path = tmp_path / "ha.secret"
    path.write_bytes(content)
    os.chmod(path, mode)
    return str(path)


def test_the_secret_file_must_be_private_and_long_enough(tmp_path: Path) -> None:
    assert read_secret_file(secret_file(tmp_path)) == SECRET  # the newline is not part of it
    with pytest.raises(ConfigError, match=r"group or others.*chmod 600"):
        read_secret_file(secret_file(tmp_path, mode=0o640))
    with pytest.raises(ConfigError, match="group or others"):
        read_secret_file(secret_file(tmp_path, mode=0o604))
    with pytest.raises(ConfigError, match=r"16\.\.4096 bytes"):
        read_secret_file(secret_file(tmp_path, b"short\n"))
    with pytest.raises(ConfigError, match="No such file"):
        read_secret_file(str(tmp_path / "missing"))
    # The broker refuses to start with such a file: a config error naming it, not the secret.
    with pytest.raises(ConfigError, match="ha_secret_file") as err:
        BrokerConfig(store_dir=str(tmp_path), ha_secret_file=secret_file(tmp_path, mode=0o644)).validate()
    assert SECRET.decode() not in str(err.value)


def test_no_file_and_auth_off_is_an_unauthenticated_link(tmp_path: Path) -> None:
    link = LinkSecret(BrokerConfig(store_dir=str(tmp_path)))
    assert not link.required
    assert link.auth() is None
    assert link.status() == "off"


def test_a_secret_file_authenticates_the_link(tmp_path: Path) -> None:
    link = LinkSecret(BrokerConfig(store_dir=str(tmp_path), ha_secret_file=secret_file(tmp_path)))
    auth = link.auth()
    assert auth is not None
    assert (auth.group, auth.secret(), auth.timeout_ms) == (GROUP, SECRET, 5000)
    assert link.status() == "ha_secret_file"
    assert SECRET.decode() not in repr(link)


@pytest.mark.asyncio
async def test_the_control_planes_secret_is_kept_sealed_across_restarts(tmp_path: Path) -> None:
    cfg = BrokerConfig(store_dir=str(tmp_path), auth_enabled=True, control_plane_url="http://127.0.0.1:1")
    link = LinkSecret(cfg)
    link.load()
    auth = link.auth()
    assert auth is not None
    assert auth.secret() is None  # required, not known yet: no link
    assert link.status() == "waiting for the control plane"
    told: list[bool] = []
    link.on_change = lambda: told.append(True)
    assert await link.update(SECRET)
    assert not await link.update(SECRET)  # unchanged
    assert told == [True]
    assert auth.secret() == SECRET  # the callable sees the new secret: the next connection uses it
    sealed = tmp_path / "config" / "auth" / "ha-link.bin"
    raw = sealed.read_bytes()
    assert SECRET not in raw
    assert stat.S_IMODE(sealed.stat().st_mode) == 0o600
    again = LinkSecret(cfg)
    again.load()
    assert again.current() == SECRET
    assert again.status() == "control plane"
    # Tampered: not used, the broker waits for the control plane again.
    broken = bytearray(raw)
    broken[-3] ^= 1
    sealed.write_bytes(bytes(broken))
    third = LinkSecret(cfg)
    third.load()
    assert third.current() is None


@pytest.mark.asyncio
async def test_a_secret_file_wins_over_the_control_planes(tmp_path: Path) -> None:
    cfg = BrokerConfig(
        store_dir=str(tmp_path), auth_enabled=True, control_plane_url="http://127.0.0.1:1",
        ha_secret_file=secret_file(tmp_path),
    )  # fmt: skip
    link = LinkSecret(cfg)
    assert not await link.update(b"the control plane's secret!!")
    assert link.current() == SECRET


def test_the_snapshots_ha_secret_is_checked() -> None:
    body: dict[str, Any] = {"version": 1, "credentials": [], "tenants": []}
    assert "ha_secret" not in parse_snapshot(orjson.dumps(body))
    encoded = base64.b64encode(SECRET).decode()
    snap = parse_snapshot(orjson.dumps({**body, "ha_secret": encoded}))
    assert decode_ha_secret(snap["ha_secret"]) == SECRET
    for bad in ("not base64!", base64.b64encode(b"short").decode(), 42):
        with pytest.raises(TenancyError, match="ha_secret") as err:
            parse_snapshot(orjson.dumps({**body, "ha_secret": bad}))
        assert "not base64!" not in str(err.value)


def test_the_control_plane_derives_one_secret_a_group() -> None:
    key = MasterKey(bytes(range(32)))
    a = ha_link_secret(key, "broker-a")
    assert len(a) == 32
    assert a == ha_link_secret(MasterKey(bytes(range(32))), "broker-a")
    assert a != ha_link_secret(key, "broker-b")
    assert a != ha_link_secret(MasterKey(bytes(32)), "broker-a")


# --- SLAVE_OFFSETS: what a slave may move ----------------------------------------------------------
TOPIC = "Orders"


class FakeStore:
    def __init__(self, tops: dict[tuple[str, int], int]) -> None:
        self.tops = tops

    def max_offset_in_queue(self, topic: str, queue_id: int) -> int:
        return self.tops.get((topic, queue_id), 0)


def master_replication(tmp_path: Path, *, auto_create_groups: bool = False) -> Replication:
    cfg = BrokerConfig(store_dir=str(tmp_path))
    conf = tmp_path / "config"
    topics = TopicConfigManager(
        str(conf / "topics.json"), broker_name=GROUP, auto_create=False, default_queue_nums=4, max_queue_nums=64
    )
    topics.create_or_update(TOPIC, read_queue_nums=2, write_queue_nums=2)
    groups = SubscriptionGroupManager(str(conf / "groups.json"), auto_create=auto_create_groups)
    groups.update("readers", {})
    broker = SimpleNamespace(
        config=cfg,
        topics=topics,
        groups=groups,
        offsets=ConsumerOffsetManager(str(conf / "offsets.json")),
        store=FakeStore({(TOPIC, 0): 100, (TOPIC, 1): 50}),
    )
    return Replication(broker)  # type: ignore[arg-type]


def report(rep: Replication, table: dict[str, Any]) -> None:
    rep.on_slave_offsets(orjson.dumps({"offsetTable": table}))


def test_a_slaves_offsets_are_clamped_to_the_masters_queues(tmp_path: Path) -> None:
    rep = master_replication(tmp_path)
    offsets = rep.broker.offsets
    offsets.commit("readers", TOPIC, 1, 20)
    report(rep, {f"{TOPIC}@readers": {"0": 1_000_000, "1": 30}})
    assert offsets.query("readers", TOPIC, 0) == 100  # the queue's max offset here, not 1,000,000
    assert offsets.query("readers", TOPIC, 1) == 30  # ahead and within the queue: taken
    assert (rep.slave_offsets_clamped, rep.slave_offsets_ignored) == (1, 0)
    report(rep, {f"{TOPIC}@readers": {"1": 10}})  # behind: the master's stays
    assert offsets.query("readers", TOPIC, 1) == 30
    info = rep.runtime_info()
    assert (info["haSlaveOffsetsClamped"], info["haSlaveOffsetsIgnored"]) == (1, 0)


def test_a_slaves_offsets_for_what_the_master_does_not_know_are_ignored(tmp_path: Path) -> None:
    rep = master_replication(tmp_path)
    offsets = rep.broker.offsets
    report(
        rep,
        {
            "Unknown@readers": {"0": 5},  # no such topic here
            f"{TOPIC}@strangers": {"0": 5},  # no such group here (groups are not created on use)
            f"{TOPIC}@readers": {"2": 5, "-1": 5, "0": -5, "x": 5, "1": True},  # queue ids 0..1 only
            "no-separator": {"0": 5},
            f"{TOPIC}@readers2": "not an object",
        },
    )
    assert offsets.table == {}
    assert rep.slave_offsets_ignored == 9
    rep.on_slave_offsets(b"not json")
    rep.on_slave_offsets(b'{"offsetTable": [1, 2]}')
    assert offsets.table == {}
    assert rep.slave_offsets_ignored == 11


def test_groups_created_on_use_are_taken_where_the_master_creates_them(tmp_path: Path) -> None:
    rep = master_replication(tmp_path, auto_create_groups=True)
    report(rep, {f"{TOPIC}@new-readers": {"0": 7}})
    assert rep.broker.offsets.query("new-readers", TOPIC, 0) == 7


# --- the metric ------------------------------------------------------------------------------------
def test_the_refusal_counter_reports_each_reason_at_collection() -> None:
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from data_plane.telemetry import register_ha_link_refusals, setup_telemetry

    reader = InMemoryMetricReader()
    t = setup_telemetry("orbit-broker-test", exporter="none", metric_readers=[reader], set_global=False)
    refused: collections.Counter[str] = collections.Counter()
    register_ha_link_refusals(t, refused, broker_name="broker-a")

    def counts() -> dict[str, int]:
        return counter_points(reader, "orbit.broker.ha.link.refused", "orbit.refusal.reason")

    assert counts() == {}
    refused["bad_proof"] += 2
    refused["auth_timeout"] += 1
    assert counts() == {"bad_proof": 2, "auth_timeout": 1}
    t.shutdown()
