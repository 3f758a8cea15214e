"""Broker-side message filters beyond tags: SQL92 expressions over a message's properties
(RocketMQ's ``ExpressionType.SQL92``). See docs/filters_and_trace.md."""

from __future__ import annotations

from data_plane.filter.sql92 import (
    EXPRESSION_TYPE_SQL92,
    EXPRESSION_TYPE_TAG,
    PredicateCache,
    SqlParseError,
    SqlPredicate,
    compile_sql92,
    record_properties,
)

__all__ = [
    "EXPRESSION_TYPE_SQL92",
    "EXPRESSION_TYPE_TAG",
    "PredicateCache",
    "SqlParseError",
    "SqlPredicate",
    "compile_sql92",
    "record_properties",
]
