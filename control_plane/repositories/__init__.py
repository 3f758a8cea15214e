"""Repositories: plain SQL over asyncpg, one module per table family. Functions take the
connection (so a service decides the transaction) and, when they touch a tenant's data, the
tenant id as the required keyword ``tenant_id``. Missing rows raise the domain's not-found errors.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from control_plane.db import Record


def jsonable(record: Record, *, drop: tuple[str, ...] = ()) -> dict[str, Any]:
    """A row as a JSON-ready dict: timestamps as ISO 8601 text, ``drop`` columns left out."""
    out: dict[str, Any] = {}
    for key, value in record.items():
        if key in drop:
            continue
        out[key] = value.isoformat() if isinstance(value, dt.datetime) else value
    return out
