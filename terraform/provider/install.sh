#!/usr/bin/env bash
# Installs the Orbit Terraform provider into a filesystem mirror, for Terraform without any
# registry (docs/terraform.md#installing-the-provider):
#   terraform/provider/install.sh [--dir DIR] [--python PYTHON]
# makes .venv with the provider's framework (PyPI `tf`) first, then prints the line to use it:
#   export TF_CLI_CONFIG_FILE=DIR/orbit.tfrc
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
"$root/scripts/venv.sh" terraform >&2
PYTHONPATH="$root/terraform/provider" exec "$root/.venv/bin/python" -m orbit_provider.mirror "$@"
