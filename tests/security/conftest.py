"""The security tier: each test attacks Orbit from outside, through real processes (name servers,
brokers, the control plane, PostgreSQL) on 127.0.0.1, and shows the attack refused."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/security/" in str(item.path).replace("\\", "/"):
            item.add_marker(pytest.mark.security)


# The real-process fixtures of the integration tier (name servers and brokers on 127.0.0.1:0).
from tests.integration.conftest import (  # noqa: E402
    namesrv,
    processes,
    start_broker,
    start_namesrv,
)

__all__ = ["namesrv", "processes", "start_broker", "start_namesrv"]
