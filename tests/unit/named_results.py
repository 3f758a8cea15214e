"""Assertions about the compiled store module's named results (``_speedups``' struct sequences
against ``fastpath``'s NamedTuples), shared by the twin tests."""

from __future__ import annotations

from typing import Any

from data_plane.store import fastpath


def assert_named_alike(compiled: Any, python: Any) -> None:
    """Two twins' answers: each its module's class of one name (fastpath's NamedTuple, _speedups'
    struct sequence), the fields named alike in the same order, and equal read by name — a field
    misnamed, or two swapped, in either twin fails this even where the tuples are equal."""
    cls = type(python)
    assert issubclass(cls, tuple)
    assert cls is getattr(fastpath, cls.__name__), cls
    assert (type(compiled).__module__, type(compiled).__name__) == ("data_plane.store._speedups", cls.__name__)
    assert type(compiled).__match_args__ == cls._fields
    assert {name: getattr(compiled, name) for name in cls._fields} == python._asdict()
    assert tuple(compiled) == tuple(python)
