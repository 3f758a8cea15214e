"""Prints one package of uv.lock as a pip requirement with its hashes: ``name==version --hash=…``.

scripts/venv.sh installs uv itself this way (pip --require-hashes), before uv installs the rest
of the lock. Standard library only: it runs on the interpreter .venv is made from.

Usage: python scripts/locked_tool.py <uv.lock> <package>     (exit 1 when the lock lacks it)
"""

from __future__ import annotations

import sys
import tomllib


def requirement(lock_path: str, name: str) -> str | None:
    with open(lock_path, "rb") as f:
        lock = tomllib.load(f)
    for package in lock.get("package", []):
        if package.get("name") != name:
            continue
        files = [*package.get("wheels", [])]
        if "sdist" in package:
            files.append(package["sdist"])
        hashes = sorted({entry["hash"] for entry in files if "hash" in entry})
        if not hashes:
            return None
        return f"{name}=={package['version']} " + " ".join(f"--hash={h}" for h in hashes)
    return None


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    line = requirement(argv[1], argv[2])
    if line is None:
        print(f"{argv[1]} has no hashed entry for {argv[2]}", file=sys.stderr)
        return 1
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
