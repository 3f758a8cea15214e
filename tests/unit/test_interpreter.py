"""Which interpreter .venv is made from (scripts/venv.sh) and how the benchmarks report it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from data_plane.interpreter import interpreter_facts, libpython

ROOT = Path(__file__).resolve().parents[2]
VENV_SH = ROOT / "scripts" / "venv.sh"
# scripts/venv.sh's candidates, in its order
CANDIDATES = (
    "python3", "python3.13", "python3.12", "python3.11",
    "/usr/bin/python3", "/usr/bin/python3.13", "/usr/bin/python3.12", "/usr/bin/python3.11",
)  # fmt: skip
FACTS = (
    "import json, os, sys, sysconfig, ensurepip, venv;"
    "from data_plane.interpreter import libpython;"
    "print(json.dumps([sys.version_info >= (3, 11), libpython(), os.path.realpath(sys.executable),"
    " os.path.exists(os.path.join(sysconfig.get_paths()['include'], 'Python.h'))]))"
)


def _which(**env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(VENV_SH), "--which"],
        check=False,
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=120,
    )


def _facts(exe: str) -> tuple[bool, str, str, bool] | None:
    r = subprocess.run([exe, "-c", FACTS], check=False, capture_output=True, text=True, cwd=ROOT, timeout=60)
    if r.returncode != 0:
        return None  # too old, or no venv module
    ok, kind, path, headers = json.loads(r.stdout)
    return ok, kind, path, headers


def test_this_process_reports_how_it_is_linked() -> None:
    maps = Path("/proc/self/maps")
    if not maps.exists():
        assert libpython() == "unknown"
        return
    linked = any("libpython" in line for line in maps.read_text().splitlines())
    assert libpython() == ("shared" if linked else "static")
    facts = interpreter_facts()
    assert facts["libpython"] == libpython()
    assert facts["python_executable"] == os.path.realpath(sys.executable)
    assert facts["python"] == ".".join(map(str, sys.version_info[:3]))


def test_run_as_a_script_it_is_the_probe_scripts_venv_sh_reads() -> None:
    script = str(ROOT / "data_plane" / "interpreter.py")
    base = os.path.realpath(getattr(sys, "_base_executable", sys.executable))  # what made .venv: usable
    r = subprocess.run([base, "-I", script], check=False, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    kind, path = r.stdout.split()
    assert kind in ("static", "shared")
    assert path == base
    as_if_old = "import sys; sys.version_info = (3, 10); exec(open(sys.argv[1]).read())"  # an older Python
    refused = subprocess.run(
        [base, "-I", "-c", as_if_old, script], check=False, capture_output=True, text=True, timeout=60
    )
    assert (refused.returncode, refused.stdout) == (1, ""), refused.stderr


def test_the_venv_is_made_from_an_interpreter_linked_into_its_executable_when_there_is_one() -> None:
    r = _which(PYTHON="")
    assert r.returncode == 0, r.stderr
    chosen = r.stdout.strip()
    usable = []
    for c in CANDIDATES:
        exe = shutil.which(c)
        facts = _facts(exe) if exe else None
        if facts and facts[0] and facts[3]:
            usable.append(facts)
    assert usable, "this machine has a Python 3.11+ with venv and headers (the suite runs on one)"
    static = [path for _ok, kind, path, _h in usable if kind == "static"]
    expected = static[0] if static else usable[0][2]
    print("usable interpreters:", usable)
    assert chosen == expected


def test_the_venv_the_suite_runs_in_was_made_from_the_interpreter_chosen() -> None:
    if os.environ.get("PYTHON"):
        pytest.skip("PYTHON chooses the interpreter for this run")
    cfg = Path(sys.prefix) / "pyvenv.cfg"
    if Path(sys.prefix).resolve() != (ROOT / ".venv").resolve() or not cfg.exists():
        pytest.skip("not running from the repository's .venv")
    made_from = next(
        line.split("=", 1)[1].strip() for line in cfg.read_text().splitlines() if line.startswith("executable")
    )
    assert os.path.realpath(made_from) == _which(PYTHON="").stdout.strip()


def test_python_named_by_the_user_wins_and_a_bad_one_is_refused_clearly() -> None:
    r = _which(PYTHON=sys.executable)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == os.path.realpath(sys.executable)
    bad = _which(PYTHON="/bin/false")
    assert bad.returncode != 0
    assert "PYTHON=/bin/false is not a Python 3.11+" in bad.stderr
    assert bad.stdout == ""


def test_the_choice_is_kept_until_the_interpreters_found_change(tmp_path: Path) -> None:
    """./orbit passes through scripts/venv.sh on every command: while the candidates found (and
    their files' times) stay the same, the interpreter chosen before stands and none is started
    to probe. A copy of the script in a scratch tree, run with --choose (nothing installed)."""
    root = tmp_path / "repo"
    (root / "scripts").mkdir(parents=True)
    shutil.copy(VENV_SH, root / "scripts" / "venv.sh")
    (root / "data_plane").mkdir()
    shutil.copy(ROOT / "data_plane" / "interpreter.py", root / "data_plane" / "interpreter.py")  # the probe
    base = os.path.realpath(getattr(sys, "_base_executable", sys.executable))  # what built the suite's .venv: usable
    venv_bin = root / ".venv" / "bin"
    venv_bin.mkdir(parents=True)
    (venv_bin / "python").write_text("#!/bin/sh\nexit 0\n")
    (venv_bin / "python").chmod(0o755)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    probed = tmp_path / "probed"
    fake = bin_dir / "python3"  # a candidate that cannot make a venv, and says when it is run
    fake.write_text(f"#!/bin/sh\necho run >> {probed}\nexit 1\n")
    fake.chmod(0o755)
    (bin_dir / "python3.11").symlink_to(base)
    env = {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin", "PYTHON": ""}
    chosen = _which(PATH=env["PATH"], PYTHON="").stdout.strip()
    assert probed.read_text().count("run") == 1  # (--which always probes)
    # .venv made from the interpreter the script will choose: it is kept, not made again
    (root / ".venv" / "pyvenv.cfg").write_text(f"home = {os.path.dirname(chosen)}\nexecutable = {chosen}\n")

    def venv_sh() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", str(root / "scripts" / "venv.sh"), "--choose"],
            check=False,
            capture_output=True,
            text=True,
            env=env,
        )

    first = venv_sh()
    assert first.returncode == 0, first.stderr
    assert probed.read_text().count("run") == 2  # probed, found unusable
    assert (root / ".venv" / ".orbit-python").read_text().splitlines()[0] == chosen
    assert (venv_bin / "python").read_text() == "#!/bin/sh\nexit 0\n"  # not made again
    again = venv_sh()
    assert again.returncode == 0, again.stderr
    assert probed.read_text().count("run") == 2  # the kept choice: nothing started
    assert (root / ".venv" / ".orbit-python").read_text().splitlines()[0] == chosen
    os.utime(fake, (1, 1))  # the candidate changed: probe again
    changed = venv_sh()
    assert changed.returncode == 0, changed.stderr
    assert probed.read_text().count("run") == 3
