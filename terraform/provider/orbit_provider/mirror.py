"""Install the provider into a Terraform filesystem mirror, for use without any registry:

    python -m orbit_provider.mirror [--dir DIR] [--python PYTHON]
    (or terraform/provider/install.sh, which makes the virtual environment first)

It writes, in DIR (default ``$XDG_DATA_HOME/orbit/terraform-mirror``, i.e.
``~/.local/share/orbit/terraform-mirror``):

- ``registry.terraform.io/orbit-mq/orbit/<version>/<os>_<arch>/terraform-provider-orbit_v<version>``:
  a launcher that runs ``PYTHON -m orbit_provider`` with this package on its path (Terraform's
  "unpacked" mirror layout);
- ``orbit.tfrc``: a CLI configuration that takes ``orbit-mq/orbit`` from that mirror and every
  other provider from its registry as usual. Point Terraform at it with
  ``export TF_CLI_CONFIG_FILE=DIR/orbit.tfrc`` (or copy its block into ``~/.terraformrc``).

The launcher holds absolute paths (this checkout, the Python): run the command again after moving
either.
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path

from orbit_provider import ADDRESS, HOSTNAME, NAMESPACE, TYPE, VERSION

PACKAGE_ROOT = Path(__file__).resolve().parent.parent  # terraform/provider: holds orbit_provider/
ARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64", "i386": "386", "i686": "386"}


def target_platform() -> str:
    """Terraform's name for this machine: linux_amd64, darwin_arm64, ..."""
    machine = platform.machine().lower()
    return f"{platform.system().lower()}_{ARCH.get(machine, machine)}"


def default_dir() -> Path:
    data_home = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(data_home) / "orbit" / "terraform-mirror"


def launcher_text(python: str, package_root: Path = PACKAGE_ROOT) -> str:
    root = shlex.quote(str(package_root))
    return (
        "#!/bin/sh\n"
        f"# Orbit Terraform provider {VERSION} ({ADDRESS}), made by `python -m orbit_provider.mirror`:\n"
        "# runs the provider package from the Orbit checkout with that Python. Make it again after\n"
        "# moving either.\n"
        f'PYTHONPATH={root}"${{PYTHONPATH:+:$PYTHONPATH}}"\n'
        "export PYTHONPATH\n"
        f'exec {shlex.quote(python)} -m orbit_provider "$@"\n'
    )


def cli_config_text(mirror_dir: Path) -> str:
    source = f"{HOSTNAME}/{NAMESPACE}/{TYPE}"
    return (
        "# Terraform CLI configuration: the Orbit provider from a filesystem mirror, every other\n"
        "# provider from its registry. Use it with TF_CLI_CONFIG_FILE=<this file>.\n"
        "provider_installation {\n"
        "  filesystem_mirror {\n"
        f"    path    = {_hcl_string(str(mirror_dir))}\n"
        f'    include = ["{source}"]\n'
        "  }\n"
        "  direct {\n"
        f'    exclude = ["{source}"]\n'
        "  }\n"
        "}\n"
    )


def _hcl_string(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("${", "$${") + '"'


def check_python(python: str, package_root: Path = PACKAGE_ROOT) -> None:
    """The launcher's Python must import the framework and this package."""
    env = {**os.environ, "PYTHONPATH": str(package_root)}
    probe = subprocess.run(
        [python, "-c", "import tf.runner, orbit_provider.provider"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if probe.returncode != 0:
        raise SystemExit(
            f"{python} cannot run the provider (install the framework: pip install 'orbit-mq[terraform]'):\n"
            + probe.stderr.strip()
        )


def install(mirror_dir: Path, python: str, *, package_root: Path = PACKAGE_ROOT, check: bool = True) -> Path:
    """Write the launcher and the CLI configuration; returns the CLI configuration's path."""
    if check:
        check_python(python, package_root)
    mirror_dir = mirror_dir.resolve()
    target = mirror_dir / HOSTNAME / NAMESPACE / TYPE / VERSION / target_platform()
    target.mkdir(parents=True, exist_ok=True)
    launcher = target / f"terraform-provider-{TYPE}_v{VERSION}"
    launcher.write_text(launcher_text(python, package_root))
    launcher.chmod(0o755)
    config = mirror_dir / "orbit.tfrc"
    config.write_text(cli_config_text(mirror_dir))
    return config


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m orbit_provider.mirror", description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", type=Path, default=default_dir(), help="the mirror directory (default: %(default)s)")
    ap.add_argument("--python", default=sys.executable, help="Python that runs the provider (default: this one)")
    args = ap.parse_args(argv)
    config = install(args.dir, os.path.abspath(args.python) if os.sep in args.python else args.python)
    print(f"installed {ADDRESS} {VERSION} into {args.dir.resolve()}")
    print(f"export TF_CLI_CONFIG_FILE={shlex.quote(str(config))}")


if __name__ == "__main__":
    main()
