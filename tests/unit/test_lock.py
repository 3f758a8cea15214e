"""The locked set-up (scripts/venv.sh from uv.lock): the lock matches pyproject.toml, covers every
extra with hashes, and a set-up whose pyproject.toml disagrees with it stops at once, saying so;
run-time state is never committed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.prefix) / "bin"
UV = VENV_BIN / "uv"


def _lock() -> dict[str, Any]:
    with open(ROOT / "uv.lock", "rb") as f:
        return tomllib.load(f)


def _packages() -> list[dict[str, Any]]:
    packages: list[dict[str, Any]] = _lock()["package"]
    return packages


def test_the_lock_matches_pyproject() -> None:
    r = subprocess.run(
        [str(UV), "lock", "--check", "--offline", "--python", sys.executable],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "UV_PYTHON_DOWNLOADS": "never"},
    )
    assert r.returncode == 0, f"uv.lock is stale: run scripts/lock\n{r.stderr}"


def test_every_extra_and_group_is_locked_and_every_file_has_a_hash() -> None:
    with open(ROOT / "pyproject.toml", "rb") as f:
        project = tomllib.load(f)
    (own,) = [p for p in _packages() if p["name"] == "orbit-mq"]
    assert set(own["optional-dependencies"]) == set(project["project"]["optional-dependencies"])
    assert set(own["dev-dependencies"]) == set(project["dependency-groups"])
    for package in _packages():
        if package["name"] == "orbit-mq":
            continue
        files = [*package.get("wheels", []), *([package["sdist"]] if "sdist" in package else [])]
        assert files, package["name"]
        assert all(str(f.get("hash", "")).startswith("sha256:") for f in files), package["name"]


def test_the_installed_versions_are_the_locked_ones() -> None:
    import importlib.metadata

    locked: dict[str, set[str]] = {}  # a universal lock may hold one version per Python/platform fork
    for p in _packages():
        if "version" in p:
            locked.setdefault(str(p["name"]), set()).add(str(p["version"]))
    checked = 0
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"].lower().replace("_", "-").replace(".", "-")
        if name == "orbit-mq":
            continue
        assert name in locked, f"{name} is installed but not in uv.lock"
        assert dist.version in locked[name], f"{name} {dist.version} installed, {locked[name]} locked"
        checked += 1
    assert checked > 50


def test_the_locked_tool_line_pins_uv_with_its_hashes() -> None:
    r = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "locked_tool.py"), str(ROOT / "uv.lock"), "uv"],
        capture_output=True,
        text=True,
        check=True,
    )
    name, *hashes = r.stdout.split()
    (uv,) = [p for p in _packages() if p["name"] == "uv"]
    assert name == f"uv=={uv['version']}"
    assert len(hashes) >= 2
    assert all(h.startswith("--hash=sha256:") for h in hashes)
    missing = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "locked_tool.py"), str(ROOT / "uv.lock"), "no-such-package"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert missing.returncode == 1
    assert "no hashed entry for no-such-package" in missing.stderr


def test_a_set_up_whose_pyproject_disagrees_with_the_lock_stops_at_once_saying_so(tmp_path: Path) -> None:
    """A scratch copy of what scripts/venv.sh reads, with one dependency added to pyproject.toml
    and not to the lock: it stops before installing anything, and says what to run."""
    root = tmp_path / "repo"
    for rel in ("scripts/venv.sh", "scripts/locked_tool.py", "data_plane/interpreter.py", "uv.lock", "setup.py",
                "tests/clients/rocketmq5/uv.lock", "tests/clients/rocketmq5-node/package-lock.json"):  # fmt: skip
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, root / rel)
    for c in ROOT.glob("data_plane/*/*.c"):
        (root / c.relative_to(ROOT)).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(c, root / c.relative_to(ROOT))
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert '"orjson>=3.10,<4",' in pyproject
    (root / "pyproject.toml").write_text(pyproject.replace('"orjson>=3.10,<4",', '"orjson>=3.10,<4", "six>=1",'))
    base = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    env = {**os.environ, "PYTHON": base}
    made = subprocess.run(
        ["bash", str(root / "scripts" / "venv.sh"), "--choose"], capture_output=True, text=True, env=env, check=False
    )
    assert made.returncode == 0, made.stderr
    (root / ".venv" / "bin" / "uv").symlink_to(UV)  # the locked uv, as the first step would install it
    r = subprocess.run(
        ["bash", str(root / "scripts" / "venv.sh"), "dev"], capture_output=True, text=True, env=env, check=False
    )
    assert r.returncode == 1
    assert "uv.lock does not match pyproject.toml: run scripts/lock" in r.stderr
    assert not (root / ".venv" / ".orbit-installed").exists()
    assert not list((root / ".venv").glob("lib/python*/site-packages/orjson"))  # nothing installed


def test_run_time_state_is_ignored_by_git() -> None:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    for path in ("orbit-data/master.key", "orbit-data/demo-credentials.json", ".venv/bin/python"):
        r = subprocess.run(["git", "check-ignore", "-q", path], cwd=ROOT, check=False)
        assert r.returncode == 0, f"git would commit {path}"
