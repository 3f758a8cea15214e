"""Load generation and benchmarks: ``orbit loadtest`` (scenarios, open-loop generator processes,
peers side by side, machine limits, JSON + plots + HTML; see docs/loadtest.md and ``cli.py``)
and ``orbit bench e2e`` (``e2e.py``)."""
