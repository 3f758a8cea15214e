"""Broker group names and the ports of further groups of a local cluster."""

from __future__ import annotations

import socket

import pytest

from data_plane.group_ports import group_name, next_free_base, port_free


def test_groups_are_named_by_letter_up_to_eight() -> None:
    assert [group_name(g) for g in range(8)] == [f"broker-{c}" for c in "abcdefgh"]
    with pytest.raises(ValueError, match=r"not in 0\.\.7"):
        group_name(8)


def _free_block() -> int:
    """A port p with p .. p + 60 free now (where the test places its groups)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = int(s.getsockname()[1]) // 10 * 10 - 40
        if base > 1024 and all(port_free("127.0.0.1", p) for p in range(base, base + 60)):
            return base
    pytest.skip("no block of 60 free ports")


def test_a_further_group_takes_the_next_block_where_every_port_it_needs_is_free() -> None:
    base = _free_block()
    # After a group whose highest port is base: master at base + 10 and slave at base + 20, each
    # with its HA (+1) and gRPC (+2) port.
    assert next_free_base(base, 2, "127.0.0.1") == base + 10
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", base + 22))  # the slave's gRPC port (and, 10 up, the master's)
        taken.listen()
        assert next_free_base(base, 2, "127.0.0.1") == base + 30
