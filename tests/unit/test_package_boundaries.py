"""What the production packages may import: benchmarks and load generators live outside them
(``benchmarks``, ``loadtest``), and only the command line (``data_plane/cli``, whose ``orbit
bench`` and ``orbit loadtest`` run them) loads them."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PRODUCTION = ("control_plane", "data_plane", "sdk", "spark_integration")
TOOLS = ("benchmarks", "loadtest")
FRONT_ENDS = ("data_plane/cli/",)


def imported_roots(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    roots: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


def test_production_packages_do_not_import_benchmarks_or_load_generators() -> None:
    offenders = []
    for package in PRODUCTION:
        for path in sorted((REPO / package).rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            if rel.startswith(FRONT_ENDS):
                continue
            bad = imported_roots(path) & set(TOOLS)
            if bad:
                offenders.append(f"{rel} imports {sorted(bad)}")
    assert offenders == []


def test_no_benchmark_module_is_left_in_a_production_package() -> None:
    found = [
        path.relative_to(REPO).as_posix()
        for package in PRODUCTION
        for path in (REPO / package).rglob("*.py")
        if "bench" in path.stem
    ]
    assert found == []


def test_the_scan_sees_an_import_of_a_tool(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text("import os\nfrom benchmarks.machine import python_loop_ns\nfrom . import sibling\n")
    assert imported_roots(probe) == {"os", "benchmarks"}


# What the SDK may load of the server side: the remoting codec and client, TLS, and of the store
# and auth packages only the record codec (and its compiled twin) and request signing.
SDK_MAY_LOAD = {
    "data_plane",
    "data_plane.auth",
    "data_plane.auth.signature",
    "data_plane.lazy_exports",
    "data_plane.refusal_log",
    "data_plane.remoting",
    "data_plane.remoting._codec",
    "data_plane.remoting.bodies",
    "data_plane.remoting.client",
    "data_plane.remoting.codes",
    "data_plane.remoting.command",
    "data_plane.remoting.connection",
    "data_plane.remoting.errors",
    "data_plane.remoting.limits",
    "data_plane.remoting.server",
    "data_plane.remoting.tls_channel",
    "data_plane.store",
    "data_plane.store._records",
    "data_plane.store.compiled",
    "data_plane.store.layouts",
    "data_plane.store.message",
    "data_plane.tasks",
    "data_plane.tls",
}


@pytest.mark.parametrize("pure_python", [False, True])
def test_import_sdk_loads_no_store_engine_broker_or_control_plane(pure_python: bool) -> None:
    code = (
        "import sys, json; before = set(sys.modules); import sdk; print(json.dumps(sorted(set(sys.modules) - before)))"
    )
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), **({"ORBIT_PURE_PYTHON": "1"} if pure_python else {})}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO, check=False)
    assert r.returncode == 0, r.stderr
    ours = {m for m in json.loads(r.stdout) if m.split(".")[0] in (*PRODUCTION, *TOOLS)}
    server_side = {m for m in ours if not m.startswith("sdk")}
    assert server_side <= SDK_MAY_LOAD, sorted(server_side - SDK_MAY_LOAD)
    assert {"sdk", "sdk.producer", "sdk.push_consumer"} <= ours
