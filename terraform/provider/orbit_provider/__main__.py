"""``python -m orbit_provider``: what Terraform starts (through the mirror's launcher). It speaks
the plugin protocol on stdout (the handshake line) and a unix socket; nothing else may be printed
on stdout."""

from __future__ import annotations

import sys

from tf.runner import run_provider

from orbit_provider.provider import OrbitProvider


def main() -> None:
    run_provider(OrbitProvider(), sys.argv)


if __name__ == "__main__":
    main()
