"""The official RocketMQ 5 Python client (``rocketmq-python-client``, unmodified) playing one role
of tests/clients/rocketmq5/scenario.py against a real endpoint, in the virtual environment
scripts/venv.sh dev builds for it from its own lock (.venv/opt/rocketmq5): it needs protobuf 6+,
which Orbit's own lock cannot take. A role runs as a process of its own with a deadline, so a
client that hangs fails the test instead of hanging it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = ROOT / "tests" / "clients" / "rocketmq5" / "scenario.py"
CLIENT_PYTHON = Path(sys.prefix) / "opt" / "rocketmq5" / "bin" / "python"


def client_python() -> Path:
    where = CLIENT_PYTHON.parent.parent
    assert CLIENT_PYTHON.exists(), f"the official RocketMQ 5 Python client is not in {where} (scripts/venv.sh dev)"
    return CLIENT_PYTHON


def run(role: str, args: dict[str, Any], *, home: Path, timeout_s: float = 90.0) -> dict[str, Any]:
    """Play ``role`` with ``args``; its JSON result. ``home`` takes the client's log directory."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env.update(HOME=str(home), TZ="UTC")  # the client signs its local time as if it were UTC
    home.mkdir(parents=True, exist_ok=True)
    try:
        r = subprocess.run(
            [str(client_python()), str(SCENARIO), role],
            input=json.dumps(args), capture_output=True, text=True, env=env, timeout=timeout_s, check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"the v5 client's {role} hung for {timeout_s} s; stderr:\n{e.stderr!r}") from None
    assert r.returncode == 0, (
        f"the v5 client's {role} exited {r.returncode}; stderr:\n{r.stderr[-4000:]}\nstdout:\n{r.stdout[-2000:]}"
        f"\nthe client's log:\n{client_log(home)[-3000:]}"
    )
    lines = r.stdout.strip().splitlines()
    assert lines, f"the v5 client's {role} printed nothing; stderr:\n{r.stderr[-4000:]}"
    out: dict[str, Any] = json.loads(lines[-1])
    return out


NODE_SCENARIO = ROOT / "tests" / "clients" / "rocketmq5-node" / "scenario.js"
NODE_MODULES = Path(sys.prefix) / "opt" / "rocketmq5-node" / "node_modules"


def run_node(role: str, args: dict[str, Any], *, home: Path, timeout_s: float = 90.0) -> dict[str, Any]:
    """``run`` for the official Node.js client (rocketmq-client-nodejs, .venv/opt/rocketmq5-node)."""
    node = shutil.which("node")
    assert node is not None, "Node.js is not installed: the Node.js client's tests need it"
    assert (NODE_MODULES / "rocketmq-client-nodejs").exists(), f"{NODE_MODULES} lacks the client (scripts/venv.sh dev)"
    env = dict(os.environ, HOME=str(home), NODE_PATH=str(NODE_MODULES), TZ="UTC")
    home.mkdir(parents=True, exist_ok=True)
    try:
        r = subprocess.run(
            [node, str(NODE_SCENARIO), role],
            input=json.dumps(args), capture_output=True, text=True, env=env, timeout=timeout_s, check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"the Node.js client's {role} hung for {timeout_s} s; stderr:\n{e.stderr!r}") from None
    assert r.returncode == 0, f"the Node.js client's {role} exited {r.returncode}; stderr:\n{r.stderr[-4000:]}"
    lines = [line for line in r.stdout.strip().splitlines() if line.startswith("{")]
    assert lines, f"the Node.js client's {role} printed nothing; stderr:\n{r.stderr[-4000:]}"
    out: dict[str, Any] = json.loads(lines[-1])
    return out


def client_log(home: Path) -> str:
    """What the client logged (~/logs/rocketmq_python), for a failing test's message."""
    log = home / "logs" / "rocketmq_python" / "rocketmq_client.log"
    return log.read_text(errors="replace")[-4000:] if log.exists() else ""
