"""Who this process is on the wire: its IPv4 address and client ids ("<ip>@<pid>#<random>").

A broker tells consumers of one group apart by client id, and every consumer of a group sorts
the same ids to split queues, so an id must be unique per client instance and stable for its
life. Two client instances in one process (tests, several groups) get different ids.
"""

from __future__ import annotations

import contextlib
import functools
import os
import secrets
import socket


@functools.cache
def local_ip() -> str:
    """The address other hosts would see this host by (no packet is sent), else loopback."""
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("10.255.255.255", 1))
        ip: str = s.getsockname()[0]
        if ip and not ip.startswith("0."):
            return ip
    return "127.0.0.1"


def new_client_id(instance_name: str | None = None) -> str:
    """``<ip>@<pid>#<random>`` (with ``#<instance name>`` before the random part when given)."""
    name = f"#{instance_name}" if instance_name else ""
    return f"{local_ip()}@{os.getpid()}{name}#{secrets.token_hex(6)}"
