"""The Spark data source's own error: a message meant for the person running the job."""

from __future__ import annotations


class OrbitSparkError(Exception):
    """A bad option, a refused credential, a range that cannot be read — with what to fix."""
