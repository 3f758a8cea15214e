"""Orbit's benchmarks and the machine measurements they share; each module runs with
``python -m benchmarks.<name>`` or through ``orbit bench`` (docs/performance.md). Nothing in
the production packages imports them."""
