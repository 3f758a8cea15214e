"""Broker group names and ports of a local cluster (``LocalCluster``, ``orbit dev up``).

Groups are named ``broker-a``, ``broker-b``, ... A broker listens on three ports: its remoting
port P, HA on P + 1 and the RocketMQ 5 gRPC endpoint on P + 2; the members of a group are
``MEMBER_PORT_STEP`` (10) apart (master P, first slave P + 10, ...). Group ``broker-a`` takes
the ports given (``--broker-port``, ``--slave-port``); each further group takes the first block
after the previous group's ports — its master at the previous group's highest port + 10, moved
up by 10 at a time while any port the group needs is taken on this machine. With the default
ports and one slave a group: broker-a 10911 / 10921, broker-b 10931 / 10941, and so on.
"""

from __future__ import annotations

import socket
import string

MAX_BROKER_GROUPS = 8
MEMBER_PORT_STEP = 10
PORTS_PER_BROKER = 3  # remoting, HA (+1), gRPC (+2)
_SEARCH_STEPS = 1000  # how far a group's block is looked for before giving up


def group_name(group: int) -> str:
    """``broker-a`` for group 0, ``broker-b`` for 1, ..."""
    if not 0 <= group < MAX_BROKER_GROUPS:
        raise ValueError(f"broker group index {group} is not in 0..{MAX_BROKER_GROUPS - 1}")
    return f"broker-{string.ascii_lowercase[group]}"


def port_free(host: str, port: int) -> bool:
    """Whether a listener could bind ``host:port`` now (with SO_REUSEADDR, as servers do)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def next_free_base(after: int, members: int, host: str) -> int:
    """The master's port of a group of ``members`` brokers placed after port ``after``: the first
    ``after + 10 k`` (k >= 1) at which every port of every member is free."""
    base = after + MEMBER_PORT_STEP
    for _ in range(_SEARCH_STEPS):
        ports = [base + MEMBER_PORT_STEP * m + i for m in range(members) for i in range(PORTS_PER_BROKER)]
        if ports[-1] > 65535:
            break
        if all(port_free(host, p) for p in ports):
            return base
        base += MEMBER_PORT_STEP
    raise OSError(f"no free block of ports for a broker group above port {after}")
