#!/usr/bin/env bash
# Creates or updates the project's virtual environment in .venv at the repository root.
# Usage: scripts/venv.sh [extras]   e.g. scripts/venv.sh dev,spark
# Installs only when pyproject.toml, setup.py or the C sources changed, or an extra is missing.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv"
if [ ! -x "$venv/bin/python" ]; then
  "${PYTHON:-python3}" -m venv "$venv"
fi
stamp="$venv/.orbit-installed"
hash="$(cat "$root/pyproject.toml" "$root/setup.py" "$root"/data_plane/*/*.c | sha256sum | cut -d' ' -f1)"
have_hash="" have_extras=""
if [ -f "$stamp" ]; then read -r have_hash have_extras < "$stamp" || true; fi
extras="${1:-}"
[ "$have_hash" = "$hash" ] && extras="$have_extras${extras:+,$extras}"
extras="$(tr ',' '\n' <<<"$extras" | sed '/^$/d' | sort -u | paste -sd, -)"
if [ "$have_hash" != "$hash" ] || [ "$have_extras" != "$extras" ]; then
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip "setuptools>=77" wheel
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -e "$root${extras:+[$extras]}"
  echo "$hash $extras" > "$stamp"
fi
