"""``orbit dev up --broker-groups 2``: two broker groups (broker-a, broker-b), each a master and a
slave, all registered with the name server and with the control plane's fleet — so a topic
created through the API with a high throughput hint is placed on both, and messages sent to a
queue on each group are consumed. Out-of-range counts are refused before anything starts."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import signal
import time
from collections.abc import Sequence
from pathlib import Path

from data_plane.dev_tenancy import operator_api
from sdk import Message, MessageQueue, Producer
from sdk.credentials import ClientCredentials
from tests.integration.helpers import orbit, start_dev_up

DEADLINE_S = 180.0


def test_dev_up_refuses_a_broker_group_count_out_of_range(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORBIT_")}
    for n in ("0", "9", "two"):
        done = orbit(env, "dev", "up", "--dir", str(tmp_path / "data"), "--broker-groups", n)
        assert done.returncode == 2, done.stdout + done.stderr
        assert "is not a number of broker groups from 1 to 8" in done.stderr
    assert not (tmp_path / "data").exists()


def test_dev_up_runs_two_broker_groups_that_a_wide_topic_spreads_over(tmp_path: Path) -> None:
    ready = tmp_path / "dev.ready"
    proc, info = start_dev_up(
        tmp_path / "data", ready, "--control-plane-port", "0", "--broker-groups", "2", timeout_s=DEADLINE_S
    )
    try:
        groups = info["broker_groups"]
        assert [g["name"] for g in groups] == ["broker-a", "broker-b"]
        for g in groups:
            assert len(g["slaves"]) == 1
            assert info["brokers"][g["name"]] == g["master"]  # (the flat table stays as it was)
            assert info["brokers"][g["name"] + "-s1"] == g["slaves"][0]

        env = {k: v for k, v in os.environ.items() if not k.startswith("ORBIT_")}
        env["ORBIT_NAMESRV"] = info["namesrv"]
        operator = dict(env, ORBIT_CREDENTIALS_FILE=info["operator_credentials_file"])
        table = orbit(operator, "cluster", "status")
        assert table.returncode == 0, table.stderr
        rows = {(r[0], r[1], r[2], r[3]) for r in (line.split() for line in table.stdout.splitlines()[1:])}
        assert {(r[0], r[1], r[3]) for r in rows} == {
            ("broker-a", "0", "SYNC_MASTER"), ("broker-a", "1", "SLAVE"),
            ("broker-b", "0", "SYNC_MASTER"), ("broker-b", "1", "SLAVE"),
        }  # fmt: skip
        registered = {r[2] for r in rows}
        assert registered == {a for g in groups for a in (g["master"], *g["slaves"])}

        api = operator_api(info["control_plane"], info["operator_credentials_file"])
        fleet = api.ok("GET", "/v1/fleet/broker-groups")["broker_groups"]
        assert sorted(g["name"] for g in fleet) == ["broker-a", "broker-b"]
        by_name = {g["name"]: g for g in fleet}
        for g in groups:
            assert set(by_name[g["name"]]["broker_addrs"]) == {g["master"], *g["slaves"]}

        # 8000 msg/s: 8 queues, more than the demo topic left free on broker-a alone takes.
        api.ok("POST", "/v1/tenants/demo/topics", {"name": "wide", "throughput_hint_msgs_per_s": 8000})
        deadline = time.monotonic() + 60
        while (topic := api.ok("GET", "/v1/tenants/demo/topics/wide"))["status"] != "active":
            assert time.monotonic() < deadline, topic
            time.sleep(0.2)
        placed = {p["broker_group"]: p["queue_count"] for p in topic["placements"]}
        assert set(placed) == {"broker-a", "broker-b"}, placed
        assert sum(placed.values()) == 8, placed

        demo = info["demo"]
        creds = json.loads(Path(demo["credentials_file"]).read_text())
        sent = asyncio.run(_send_to_each_group(info["namesrv"], info["control_plane"], creds, "demo%wide"))
        assert {mq.broker_name for mq in sent.values()} == {"broker-a", "broker-b"}
        user = dict(env, ORBIT_CREDENTIALS_FILE=demo["credentials_file"])
        got = orbit(
            user, "consume", "--topic", "demo%wide", "--group", demo["group"], "--earliest", "--max", "2", "--json"
        )
        assert got.returncode == 0, got.stderr
        assert sorted(json.loads(line)["body"] for line in got.stdout.splitlines()) == sorted(sent)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    for g in groups:  # the output lists every group member
        assert f"{g['name']:<13} {g['master']}" in out
        assert f"{g['name'] + '-s1':<13} {g['slaves'][0]}" in out
    assert "broker groups broker-a, broker-b (each in the control plane's fleet)" in out


def _the(mq: MessageQueue, queues: Sequence[MessageQueue], msg: Message) -> MessageQueue:
    return mq


async def _send_to_each_group(
    namesrv: str, control_plane: str, creds: dict[str, str], topic: str
) -> dict[str, MessageQueue]:
    """One message to the first queue of each broker group the topic's route lists: body → queue."""
    token = ClientCredentials(creds["access_key"], creds["secret"], control_plane + "/oauth/token")
    sent: dict[str, MessageQueue] = {}
    try:
        async with Producer("wide-producer", namesrv_addrs=namesrv, credentials=token) as producer:
            queues = await producer.fetch_publish_queues(topic)
            for broker in sorted({q.broker_name for q in queues}):
                first = min(q for q in queues if q.broker_name == broker)
                body = f"to {broker}"
                result = await producer.send(
                    Message(topic, body.encode()), queue_selector=functools.partial(_the, first)
                )
                sent[body] = result.message_queue
    finally:
        await token.aclose()
    return sent
