"""The broker raises its open-files soft limit to the hard one at start (open_files.py): every
mapped ConsumeQueue and IndexFile file holds a descriptor, so a broker left at a soft limit of
1,024 would fail appends with EMFILE once it had about a thousand queues."""

from __future__ import annotations

import resource
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.integration.conftest import ServerProcess

LOW_SOFT_LIMIT = 1024


def _limits(pid: int) -> tuple[str, str]:
    text = Path(f"/proc/{pid}/limits").read_text()
    line = next(row for row in text.splitlines() if row.startswith("Max open files"))
    soft, hard = line.split()[3:5]
    return soft, hard


def test_a_broker_started_under_a_low_soft_limit_runs_at_the_hard_limit(
    start_broker: Callable[..., ServerProcess],
) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard <= LOW_SOFT_LIMIT:
        pytest.skip(f"the hard open-files limit here ({hard}) leaves nothing to raise")
    resource.setrlimit(resource.RLIMIT_NOFILE, (LOW_SOFT_LIMIT, hard))  # inherited by the broker
    try:
        broker = start_broker(None)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    got_soft, got_hard = _limits(broker.proc.pid)
    assert got_hard == ("unlimited" if hard == resource.RLIM_INFINITY else str(hard))
    assert got_soft != str(LOW_SOFT_LIMIT)
    assert got_soft == got_hard or hard == resource.RLIM_INFINITY
    assert "open-files limit" in broker.log_text()
