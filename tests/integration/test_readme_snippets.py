"""The README's Python snippets run as written: each ```python block is executed in a fresh
interpreter, against a real ``orbit dev up`` (the SDK tour, with the demo tenant's credentials
and the cluster's endpoints in place of the README's placeholders) or a store directory of its
own (the store tour)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.helpers import start_dev_up, stop_dev_up

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
BLOCK = re.compile(r"```python\n(.*?)```", re.S)


def python_blocks() -> list[str]:
    return BLOCK.findall((REPO / "README.md").read_text())


def run(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False, cwd=cwd, env=env
    )


def test_the_readme_has_the_sdk_and_the_store_tours() -> None:
    blocks = python_blocks()
    assert len(blocks) == 2, [b[:60] for b in blocks]
    assert "from sdk import" in blocks[0]
    assert "from data_plane.store import" in blocks[1]
    for block in blocks:
        assert "\nawait " not in block  # no top-level await: each block runs as a script


def test_the_sdk_tour_runs_against_dev_up_and_closes_what_it_opens(tmp_path: Path) -> None:
    code = python_blocks()[0]
    proc, info = start_dev_up(tmp_path / "data", tmp_path / "dev.ready", "--control-plane-port", "0", timeout_s=120)
    try:
        creds = json.loads(Path(info["demo"]["credentials_file"]).read_text())
        for placeholder, value in (
            ("<access key>", creds["access_key"]),
            ("<secret>", creds["secret"]),
            ("http://127.0.0.1:8080", info["control_plane"]),
            ("127.0.0.1:9876", info["namesrv"]),
        ):
            assert placeholder in code, placeholder
            code = code.replace(placeholder, value)
        r = run(code, tmp_path)
    finally:
        stop_dev_up(proc)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.splitlines()
    assert lines[0].startswith("SEND_OK "), lines
    assert any(line.endswith("paid b'hello'") for line in lines[1:]), lines
    assert "Unclosed" not in r.stderr, r.stderr[-3000:]  # every session and connection closed


def test_the_store_tour_runs_and_prints_what_it_says(tmp_path: Path) -> None:
    code = python_blocks()[1]
    assert '"/var/lib/orbit/store"' in code
    r = run(code.replace('"/var/lib/orbit/store"', repr(str(tmp_path / "store"))), tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.splitlines()
    assert lines[0].startswith("PutMessageStatus.PUT_OK "), lines
    assert lines[1] == "GetMessageStatus.FOUND 1 [b'hello']", lines
