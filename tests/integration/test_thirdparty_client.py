"""An unmodified third-party RocketMQ client from PyPI against a real Orbit name server and broker:
produce, push-consume and pull-consume, with keys, tags, user properties, a body the client
compresses and a tag-filtered subscription.

Two clients, both ctypes bindings over Apache's C++ client (each ships its own librocketmq.so):

* ``rocketmq-python-cvs==2.1.0.3`` (dev extra): the rocketmq-client-python 2.0 API over C++
  client 2.x, which sends SEND_MESSAGE_V2;
* ``rocketmq==0.4.4``: C++ client 1.0.1, which sends SEND_MESSAGE with long field names. It
  installs a package named ``rocketmq`` too, so scripts/venv.sh installs it apart, from the
  lock, into ``.venv/opt/rocketmq-0.4.4``, which these tests put first on PYTHONPATH.

The client runs in a subprocess (tests/integration/thirdparty_client_script.py): its faults are
segfaults and hangs, which a subprocess with a timeout turns into a test failure. Orbit's own
AdminClient checks what the broker stored and what the consumer groups committed.
"""

from __future__ import annotations

import asyncio
import base64
import importlib.metadata
import json
import os
import platform
import random
import string
import subprocess
import sys
import time
import zlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from data_plane.store.message import FLAG_COMPRESSED, StoredMessage
from sdk.admin import AdminClient, AdminError, QueueProgress
from tests.integration.helpers import NO_DISK_POLICY

if TYPE_CHECKING:
    from tests.integration.conftest import ServerProcess

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        not (sys.platform == "linux" and platform.machine() == "x86_64"),
        reason="the third-party clients bundle a linux x86_64 librocketmq.so",
    ),
]

SCRIPT = Path(__file__).with_name("thirdparty_client_script.py")
CLIENT_TIMEOUT_S = 60.0
# Small files, so a broker starts in a fraction of a second; and no DISK_FULL refusals while the
# shared test disk is more than 90 % used (disk policy is not what these tests are about).
BROKER_FLAGS = [
    "--store-set",
    "commit_log_file_size_bytes=8388608",
    "--store-set",
    "reserve_ahead_bytes=0",
    "--store-set",
    "index_hash_slots=1024",
    "--store-set",
    "index_max_entries=4096",
    *NO_DISK_POLICY,
]
PROP = "orbit-prop"
SEND_OK = 0
CVS = "rocketmq-python-cvs==2.1.0.3"
OLD = "rocketmq==0.4.4"


OLD_CLIENT_DIR = Path(sys.prefix) / "opt" / "rocketmq-0.4.4"  # where scripts/venv.sh dev installs it


@pytest.fixture(scope="session")
def old_client_path() -> Path:
    assert (OLD_CLIENT_DIR / "rocketmq" / "librocketmq.so").exists(), (
        f"{OLD} is not in {OLD_CLIENT_DIR}: scripts/venv.sh dev installs it from the lock"
    )
    return OLD_CLIENT_DIR


@dataclass
class Client:
    """Runs one role of thirdparty_client_script.py against ``namesrv``."""

    name: str
    namesrv: str
    workdir: Path
    pythonpath: Path | None

    def run(self, role: str, topic: str, group: str, *args: str, stdin: Any = None) -> dict[str, Any]:
        home = self.workdir / "home"
        logs = self.workdir / "clientlogs"
        logs.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, HOME=str(home))
        env.pop("PYTHONPATH", None)
        if self.pythonpath is not None:
            env["PYTHONPATH"] = str(self.pythonpath)
        cmd = [sys.executable, "-X", "faulthandler", str(SCRIPT), role, self.namesrv, topic, group]
        cmd += ["--log-dir", str(logs), "--prop", PROP, *args]
        text_in = None if stdin is None else json.dumps(stdin)
        try:
            r = subprocess.run(
                cmd, input=text_in, capture_output=True, text=True, env=env, timeout=CLIENT_TIMEOUT_S, check=False
            )
        except subprocess.TimeoutExpired as e:
            raise AssertionError(f"{self.name} {role} hung for {CLIENT_TIMEOUT_S} s; stderr:\n{e.stderr!r}") from None
        assert r.returncode == 0, f"{self.name} {role} exited {r.returncode}; stderr:\n{r.stderr[-4000:]}"
        out: dict[str, Any] = json.loads(r.stdout.strip().splitlines()[-1])
        if self.pythonpath is not None:  # the client under test, not the one in the venv
            assert Path(out["library"]).is_relative_to(self.pythonpath), out["library"]
        return out

    def produce(self, topic: str, specs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        results: list[dict[str, Any]] = self.run("produce", topic, f"pg-{topic}", stdin=specs)["results"]
        assert [r["status"] for r in results] == [SEND_OK] * len(specs), results
        assert len({r["msg_id"] for r in results}) == len(specs), results
        return results

    def push(self, topic: str, group: str, *, expect: int, expression: str = "*") -> list[dict[str, Any]]:
        """Every message a push consumer gets, once ``expect`` arrived and then 0.5 s passed quietly."""
        out = self.run("push", topic, group, "--expression", expression, "--expect", str(expect), "--idle-s", "0.5")
        msgs: list[dict[str, Any]] = out["messages"]
        assert not out["timed_out"], f"{self.name} push got {len(msgs)} of {expect}: {msgs}"
        return msgs

    def pull(self, topic: str, group: str, *, expression: str = "*") -> list[dict[str, Any]]:
        msgs: list[dict[str, Any]] = self.run("pull", topic, group, "--expression", expression)["messages"]
        return msgs


@pytest.fixture(params=[CVS, OLD])
def client(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    namesrv: ServerProcess,
    start_broker: Callable[..., ServerProcess],
) -> Client:
    """The client, against a fresh name server and broker (topics are auto-created on first send)."""
    pythonpath: Path | None = None
    if request.param == CVS:
        try:
            version = importlib.metadata.version("rocketmq-python-cvs")
        except importlib.metadata.PackageNotFoundError:
            version = None
        assert version == CVS.partition("==")[2], f"{CVS} is not installed (found {version}): pip install -e '.[dev]'"
    else:
        pythonpath = request.getfixturevalue("old_client_path")
    start_broker(namesrv.address, *BROKER_FLAGS)
    return Client(request.param, namesrv.address, tmp_path, pythonpath)


# --- helpers ------------------------------------------------------------------------------------
def specs(n: int, *, tags: Callable[[int], str] = lambda i: "tagA" if i % 2 == 0 else "tagB") -> list[dict[str, Any]]:
    return [{"body": f"body-{i}", "tags": tags(i), "keys": f"key-{i}", "props": {PROP: f"value-{i}"}} for i in range(n)]


def expected(spec: list[dict[str, Any]], results: list[dict[str, Any]]) -> list[tuple[str, str, str, str, str]]:
    """(msg id, body, tags, keys, property) of each sent message, sorted."""
    return sorted(
        (r["msg_id"], s["body"], s["tags"], s["keys"], s["props"][PROP]) for s, r in zip(spec, results, strict=True)
    )


def received(msgs: list[dict[str, Any]]) -> list[tuple[str, str, str, str, str]]:
    return sorted(
        (m["id"], base64.b64decode(m["body_b64"]).decode(), m["tags"], m["keys"], m["props"][PROP]) for m in msgs
    )


def assert_dense_offsets(msgs: list[dict[str, Any]]) -> None:
    """Each queue's messages carry offsets 0, 1, 2, ... (every message once, nothing skipped)."""
    per_queue: dict[int, list[int]] = {}
    for m in msgs:
        per_queue.setdefault(m["queue_id"], []).append(m["queue_offset"])
    for q, offs in per_queue.items():
        assert sorted(offs) == list(range(len(offs))), f"queue {q}: {sorted(offs)}"


def admin_query(namesrv: str, topic: str, keys: list[str]) -> dict[str, list[StoredMessage]]:
    async def go() -> dict[str, list[StoredMessage]]:
        async with AdminClient([namesrv]) as admin:
            # A topic the sends created reaches the name server with the broker's next
            # registration, which the sends do not wait for.
            deadline = time.monotonic() + 10
            while True:
                try:
                    await admin.route(topic)
                    break
                except AdminError:
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.05)
            return {k: await admin.query_by_key(topic, k) for k in keys}

    return asyncio.run(go())


def admin_progress(namesrv: str, group: str, topic: str) -> list[QueueProgress]:
    async def go() -> list[QueueProgress]:
        async with AdminClient([namesrv]) as admin:
            return await admin.group_progress(group, topic)

    return asyncio.run(go())


def assert_caught_up(namesrv: str, group: str, topic: str, total: int) -> None:
    """The group committed, on every queue, the offset after the queue's last message."""
    rows = admin_progress(namesrv, group, topic)
    assert sum(r.broker_offset for r in rows) == total, rows
    assert [(r.queue_id, r.consumer_offset) for r in rows] == [(r.queue_id, r.broker_offset) for r in rows], rows


# --- tests --------------------------------------------------------------------------------------
def test_produce_stores_keys_tags_and_properties(client: Client) -> None:
    topic = "TpProduce"
    spec = specs(12)
    results = client.produce(topic, spec)
    found = admin_query(client.namesrv, topic, [s["keys"] for s in spec])
    stored = []
    for s, r in zip(spec, results, strict=True):
        assert len(found[s["keys"]]) == 1, found[s["keys"]]
        m = found[s["keys"]][0]
        assert m.topic == topic
        assert m.body == s["body"].encode()
        assert m.tags == s["tags"]
        assert m.keys == [s["keys"]]
        assert m.properties[PROP] == s["props"][PROP]
        assert m.properties["UNIQ_KEY"] == r["msg_id"]
        assert m.queue_offset == r["offset"], (m, r)
        assert m.sys_flag & FLAG_COMPRESSED == 0
        stored.append({"queue_id": m.queue_id, "queue_offset": m.queue_offset})
    assert_dense_offsets(stored)
    assert len({m["queue_id"] for m in stored}) > 1, "the producer spreads messages over the topic's queues"


def test_push_consumer_gets_every_message(client: Client) -> None:
    topic = "TpPush"
    spec = specs(12)
    results = client.produce(topic, spec)
    msgs = client.push(topic, "cg-push", expect=len(spec))
    assert received(msgs) == expected(spec, results)
    assert {m["topic"] for m in msgs} == {topic}
    assert {m["reconsume_times"] for m in msgs} == {0}
    assert_dense_offsets(msgs)
    # shutdown() committed the group's offsets
    assert_caught_up(client.namesrv, "cg-push", topic, len(spec))


def test_pull_consumer_gets_every_message(client: Client) -> None:
    topic = "TpPull"
    spec = specs(140)  # about 35 a queue: more than one pull of max_num=32 each
    results = client.produce(topic, spec)
    msgs = client.pull(topic, "cg-pull")
    assert received(msgs) == expected(spec, results)
    assert_dense_offsets(msgs)
    assert max(Counter(m["queue_id"] for m in msgs).values()) > 32


def test_large_message_is_compressed_and_round_trips(client: Client) -> None:
    topic = "TpLarge"
    rnd = random.Random(20240607)
    big = "".join(rnd.choice(string.ascii_letters + string.digits + " ") for _ in range(20_000))
    spec = [
        {"body": big, "tags": "tagA", "keys": "big", "props": {PROP: "large"}},
        {"body": "small", "tags": "tagA", "keys": "small", "props": {PROP: "small"}},
    ]
    results = client.produce(topic, spec)
    # Stored as the client sent it: zlib-compressed, with the sysFlag bit that says so.
    found = admin_query(client.namesrv, topic, ["big", "small"])
    big_stored, small_stored = found["big"][0], found["small"][0]
    assert big_stored.sys_flag & FLAG_COMPRESSED
    assert len(big_stored.body) < len(big)
    assert zlib.decompress(big_stored.body) == big.encode()
    assert small_stored.body == b"small"
    assert not small_stored.sys_flag & FLAG_COMPRESSED
    # ... and both consumers get the original bytes back.
    want = expected(spec, results)
    assert received(client.push(topic, "cg-large-push", expect=2)) == want
    assert received(client.pull(topic, "cg-large-pull")) == want


def test_tag_filtered_push_gets_only_its_tag(client: Client) -> None:
    topic = "TpTags"
    # tagB first: by the time every tagA message has arrived, each queue's tagB messages (ahead of
    # them in the queue) have been pulled past, so a wrongly delivered one would have shown up.
    spec = specs(16, tags=lambda i: "tagB" if i < 8 else "tagA")
    results = client.produce(topic, spec)
    want = [e for e in expected(spec, results) if e[2] == "tagA"]
    assert len(want) == 8
    assert received(client.push(topic, "cg-tags", expect=len(want), expression="tagA")) == want
    # The group moved past the tagB messages as well.
    assert_caught_up(client.namesrv, "cg-tags", topic, len(spec))
    # A pull with the same expression agrees.
    assert received(client.pull(topic, "cg-tags-pull", expression="tagA")) == want
