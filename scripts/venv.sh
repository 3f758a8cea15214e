#!/usr/bin/env bash
# Creates or updates the project's virtual environment in .venv at the repository root.
# Usage: scripts/venv.sh [extras]   e.g. scripts/venv.sh dev,spark
#        scripts/venv.sh --which    prints the interpreter .venv is (or would be) made from
# Installs only when pyproject.toml, setup.py or the C sources changed, or an extra is missing.
#
# The interpreter: $PYTHON if set; otherwise, of the Python 3.11+ interpreters found (python3 on
# PATH, then python3.13/3.12/3.11 on PATH and in /usr/bin) that can make a venv and have the C
# headers, the first whose interpreter is linked into its executable rather than loaded from a
# shared libpython. Distribution builds (Debian's /usr/bin/python3.11) are such, and are built
# with profile-guided optimization; a default pyenv build is neither, and runs Orbit's Python
# paths 1.2-1.5x slower (docs/development.md#the-interpreter). .venv is made again when the
# interpreter chosen changes.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv"

CANDIDATES=(python3 python3.13 python3.12 python3.11 /usr/bin/python3 /usr/bin/python3.13 /usr/bin/python3.12 /usr/bin/python3.11)

# Prints "<static|shared> <real path of the executable>" for a usable interpreter, nothing else
# (data_plane/interpreter.py run as a script: the standard library only, any Python runs it).
probe() {
  "$1" -I "$root/data_plane/interpreter.py" 2>/dev/null || true
}

pick() {
  local first="" c kind path seen=" "
  if [ -n "${PYTHON:-}" ]; then
    read -r kind path < <(probe "$PYTHON") || true
    if [ -z "${path:-}" ]; then
      echo "PYTHON=$PYTHON is not a Python 3.11+ with venv and its C headers" >&2
      return 1
    fi
    echo "$path"
    return
  fi
  for c in "${CANDIDATES[@]}"; do
    command -v "$c" >/dev/null 2>&1 || continue
    read -r kind path < <(probe "$c") || continue
    [ -n "$path" ] || continue
    case "$seen" in *" $path "*) continue ;; esac
    seen="$seen$path "
    if [ "$kind" = static ]; then
      echo "$path"
      return
    fi
    [ -n "$first" ] || first="$path"
  done
  if [ -z "$first" ]; then
    echo "no Python 3.11+ with venv and its C headers found (set PYTHON=/path/to/python3)" >&2
    return 1
  fi
  echo "$first"
}

# What the choice depends on, read without starting any interpreter: the candidates found and
# their files' times, and $PYTHON. While it stays the same, the choice kept in .venv stands
# (probing takes ~0.5 s, and every ./orbit command passes here).
fingerprint() {
  local c p
  for c in "${CANDIDATES[@]}"; do
    p="$(command -v "$c" 2>/dev/null)" || continue
    echo "$c=$p:$(stat -L -c %Y "$p" 2>/dev/null || true)"
  done
  echo "PYTHON=${PYTHON:-}"
}

if [ "${1:-}" = "--which" ]; then
  pick
  exit 0
fi
choice="$venv/.orbit-python"
now="$(fingerprint)"
if [ -x "$venv/bin/python" ] && [ -f "$choice" ] && [ "$(tail -n +2 "$choice")" = "$now" ]; then
  python="$(head -n 1 "$choice")"
else
  python="$(pick)"
fi
made_from=""
if [ -x "$venv/bin/python" ] && [ -f "$venv/pyvenv.cfg" ]; then
  made_from="$(sed -n 's/^executable = //p' "$venv/pyvenv.cfg")"
  [ -n "$made_from" ] && made_from="$(realpath "$made_from" 2>/dev/null || echo "$made_from")"
fi
if [ -x "$venv/bin/python" ] && [ "$made_from" != "$(realpath "$python")" ]; then
  echo "re-making .venv from $python (it was made from ${made_from:-an unknown interpreter})" >&2
  rm -rf "$venv"
fi
if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv "$venv"
fi
{ echo "$python"; echo "$now"; } > "$choice"
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
