"""The ``orbit`` command line against a real cluster: ``orbit dev up`` starts a name server and a
broker, prints the endpoints and stops cleanly on Ctrl-C; the topic, produce, consume, message and
group commands work through the name server and fail with one clear line and a non-zero exit."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration import helpers

DEADLINE_S = 60.0


def orbit(
    namesrv: str, *args: str, stdin: str | None = None, timeout_s: float = 60.0
) -> subprocess.CompletedProcess[str]:
    """``orbit *args`` against the name server ``namesrv`` (``ORBIT_NAMESRV``)."""
    return helpers.orbit(dict(os.environ, ORBIT_NAMESRV=namesrv), *args, stdin=stdin, timeout_s=timeout_s)


def json_lines(text: str) -> list[Any]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


@pytest.fixture
def dev_cluster(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], dict[str, Any]]]:
    # --no-tenancy: an open broker; these tests are about the commands (test_dev_up_tenancy.py: auth).
    proc, info = helpers.start_dev_up(tmp_path / "data", tmp_path / "dev.ready", "--no-tenancy", timeout_s=DEADLINE_S)
    try:
        yield proc, info
    finally:
        helpers.stop_dev_up(proc)


def test_dev_up_prints_its_endpoints_and_stops_cleanly_on_ctrl_c(
    dev_cluster: tuple[subprocess.Popen[str], dict[str, Any]], tmp_path: Path
) -> None:
    proc, info = dev_cluster
    assert info["namesrv"].startswith("127.0.0.1:")
    assert set(info["brokers"]) == {"broker-a", "broker-a-s1"}  # a SYNC_MASTER and its slave
    assert Path(info["data_dir"]) == tmp_path / "data"
    # The broker registered with the name server: a topic created through it is routable.
    r = orbit(info["namesrv"], "topic", "create", "cli-topic", "--queues", "2", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"topic": "cli-topic", "brokers": ["broker-a"]}

    # Both members of the group report their role and the replication link.
    def roles() -> dict[str, str]:
        r = orbit(info["namesrv"], "cluster", "status", "--json")
        assert r.returncode == 0, r.stderr
        rows = json.loads(r.stdout)["brokers"]
        return {row["addr"]: f"{row['status']['brokerRole']}/{row['status'].get('haConnected', '-')}" for row in rows}

    want = {info["brokers"]["broker-a"]: "SYNC_MASTER/-", info["brokers"]["broker-a-s1"]: "SLAVE/True"}
    deadline = time.monotonic() + 20
    while roles() != want and time.monotonic() < deadline:
        time.sleep(0.2)
    assert roles() == want
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    assert info["namesrv"] in out
    assert info["brokers"]["broker-a"] in out
    assert "stopped." in out
    # Both children are gone: their ports refuse connections.
    for addr in (info["namesrv"], *info["brokers"].values()):
        import socket

        host, port = addr.rsplit(":", 1)
        with pytest.raises(ConnectionRefusedError), socket.create_connection((host, int(port)), timeout=1):
            pass


def test_topic_produce_consume_message_and_group_commands(
    dev_cluster: tuple[subprocess.Popen[str], dict[str, Any]],
) -> None:
    _, info = dev_cluster
    ns = info["namesrv"]
    r = orbit(ns, "topic", "create", "orders", "--queues", "3")
    assert r.returncode == 0, r.stderr
    r = orbit(ns, "topic", "list", "--json")
    assert "orders" in json.loads(r.stdout)

    sent = orbit(
        ns,
        "produce",
        "--topic",
        "orders",
        "--tags",
        "paid",
        "--keys",
        "order-1,order-2",
        "--json",
        stdin="first\nsecond\nthird\n",
    )
    assert sent.returncode == 0, sent.stderr
    results = json_lines(sent.stdout)
    assert [r["status"] for r in results] == ["SEND_OK"] * 3

    described = orbit(ns, "topic", "describe", "orders", "--json")
    queues = json.loads(described.stdout)["queues"]
    assert len(queues) == 3
    assert sum(q["max"] - q["min"] for q in queues) == 3

    got = orbit(
        ns,
        "consume",
        "--topic",
        "orders",
        "--group",
        "cli-g",
        "--earliest",
        "--max",
        "3",
        "--json",
        "--timeout-s",
        "20",
    )
    assert got.returncode == 0, got.stderr
    msgs = json_lines(got.stdout)
    assert sorted(m["body"] for m in msgs) == ["first", "second", "third"]
    assert {m["tags"] for m in msgs} == {"paid"}

    progress = json.loads(orbit(ns, "group", "progress", "cli-g", "--topic", "orders", "--json").stdout)
    assert progress["lag"] == 0
    assert sum(q["consumer_offset"] for q in progress["queues"]) == 3

    one = results[0]["offset_msg_id"]
    shown = orbit(ns, "message", "get", one)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["body"] == "first"

    queried = orbit(ns, "message", "query", "--topic", "orders", "--key", "order-2")
    assert sorted(m["body"] for m in json_lines(queried.stdout)) == ["first", "second", "third"]

    reset = orbit(ns, "group", "reset-offset", "cli-g", "--topic", "orders", "--to-time", "0", "--json")
    assert reset.returncode == 0, reset.stderr
    assert {r["offset"] for r in json_lines(reset.stdout)} == {0}
    progress = json.loads(orbit(ns, "group", "progress", "cli-g", "--topic", "orders", "--json").stdout)
    assert progress["lag"] == 3


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("topic", "describe", "no-such-topic"), "does not exist"),
        (("message", "get", "not-a-message-id"), "not a message id"),
        (("message", "query", "--topic", "no-such-topic", "--key", "k"), "does not exist"),
        (("group", "progress", "g", "--topic", "no-such-topic"), "does not exist"),
        (("consume", "--topic", "no-such-topic", "--timeout-s", "3"), "no route for topic 'no-such-topic'"),
        (
            ("consume", "--topic", "demo%helo", "--timeout-s", "3"),
            "topic 'demo%helo' does not exist; create it with the API (POST /v1/tenants/demo/topics) or "
            "`orbit topic create`",
        ),
    ],
)
def test_failures_print_one_clear_line_and_exit_non_zero(
    dev_cluster: tuple[subprocess.Popen[str], dict[str, Any]], args: tuple[str, ...], says: str
) -> None:
    _, info = dev_cluster
    r = orbit(info["namesrv"], *args)
    assert r.returncode != 0
    assert says in r.stderr
    assert "Traceback" not in r.stderr


def test_an_unreachable_name_server_is_a_clear_error() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nobody listens there
    for args in (("topic", "list"), ("consume", "--topic", "orders", "--timeout-s", "3")):
        r = orbit(f"127.0.0.1:{port}", *args)
        assert r.returncode != 0, args
        assert "name server" in r.stderr, (args, r.stderr)
        assert "Traceback" not in r.stderr


def test_a_bad_broker_setting_exits_with_a_clear_error(tmp_path: Path) -> None:
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "data_plane.cli",
            "broker",
            "--listen",
            "127.0.0.1:0",
            "--store-dir",
            str(tmp_path),
            "--set",
            "default_topic_queue_nums=0",
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2
    assert "default_topic_queue_nums" in r.stderr
    assert "Traceback" not in r.stderr


def dev_up_with_a_taken_port(tmp_path: Path, *flags: str) -> tuple[int, subprocess.CompletedProcess[str]]:
    """``orbit dev up --no-tenancy`` with ``flags``, in which ``PORT`` is a port another socket holds."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = subprocess.run(
            [sys.executable, "-m", "data_plane.cli", "dev", "up", "--no-tenancy", "--dir", str(tmp_path / "data"),
             *(str(port) if f == "PORT" else f for f in flags)],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
    return port, r


def test_dev_up_with_a_port_in_use_says_which_flag_to_change_in_one_line(tmp_path: Path) -> None:
    port, r = dev_up_with_a_taken_port(tmp_path, "--namesrv-port", "PORT", "--broker-port", "0")
    assert r.returncode == 1
    assert r.stderr.strip().splitlines() == [
        f"orbit dev up: port {port} of namesrv is in use: choose another with --namesrv-port (0 picks a free one)"
    ]


def _processes_using(directory: Path) -> list[str]:
    """Command lines of the running processes that name ``directory``."""
    found = []
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # (gone, or not a process)
            continue
        if str(directory) in cmd:
            found.append(cmd)
    return found


def test_dev_up_with_the_slave_port_in_use_names_the_slave_port_flag(tmp_path: Path) -> None:
    port, r = dev_up_with_a_taken_port(tmp_path, "--namesrv-port", "0", "--broker-port", "0", "--slave-port", "PORT")
    assert r.returncode == 1
    assert r.stderr.strip().splitlines() == [
        f"orbit dev up: port {port} of broker-a-s1 is in use: choose another with --slave-port (0 picks a free one)"
    ]
    # What it started before the slave failed (the name server, the master) is stopped, not left running.
    assert _processes_using(tmp_path / "data") == []


def test_dev_help_says_what_dev_up_starts_and_every_flag_has_help() -> None:
    def run(*args: str) -> str:
        cmd = [sys.executable, "-m", "data_plane.cli", *args]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
        assert r.returncode == 0, r.stderr
        return r.stdout

    dev = run("dev", "--help")
    for part in ("control plane", "name server", "SYNC_MASTER and a slave", "--single-broker", "--no-tenancy"):
        assert part in dev, part
    up = run("dev", "up", "--help")
    assert "``" not in dev + up  # no reStructuredText markup
    from data_plane.cli import build_parser

    parser = build_parser()
    subcommands = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    dev_parser = subcommands[0].choices["dev"]
    up_parser = next(a for a in dev_parser._actions if isinstance(a, argparse._SubParsersAction)).choices["up"]
    unexplained = [a.option_strings for a in up_parser._actions if a.option_strings and not a.help]
    assert unexplained == []
    for default in ("9876", "10911", "the master's + 10", "8080", "ASYNC_FLUSH", "./orbit-data"):
        assert f"default: {default}" in " ".join(up.split()), default
