"""Which twin serves: the compiled modules (data_plane/store/_speedups.c, data_plane/remoting/_codec.c,
data_plane/proxy/_v2_codec.c)
wherever a C compiler could build them, the pure-Python twins with ORBIT_PURE_PYTHON set.

scripts/test runs the store, remoting and SDK codec tests a second time with ORBIT_PURE_PYTHON=1;
where a compiler is present and an extension is missing, its build failed, and this fails the
suite rather than letting the pure-Python twin pass in its place."""

from __future__ import annotations

import importlib

import pytest

from data_plane.proxy import v2_codec
from data_plane.remoting import command
from data_plane.store import fastpath, positions
from tests.conftest import NO_COMPILED_TWINS, PURE_PYTHON

pytestmark = pytest.mark.unit

EXTENSIONS = ("data_plane.store._speedups", "data_plane.remoting._codec", "data_plane.proxy._v2_codec")


@pytest.mark.skipif(NO_COMPILED_TWINS, reason="the compiled twins are switched off or cannot be built here")
@pytest.mark.parametrize("name", EXTENSIONS)
def test_with_a_compiler_every_extension_is_built_and_in_use(name: str) -> None:
    module = importlib.import_module(name)  # ImportError: setup.py's optional build failed
    assert module.__file__ is not None
    assert module.__file__.endswith(".so")
    assert fastpath.COMPILED
    assert fastpath.speedups_module() is not None
    assert command.compiled_decode_frame is not None
    assert positions.FilePositions is not positions.PyFilePositions
    assert positions.QueueOffsets is not dict
    assert v2_codec.COMPILED is not None


@pytest.mark.skipif(not PURE_PYTHON, reason="ORBIT_PURE_PYTHON is not set")
def test_with_orbit_pure_python_every_twin_is_the_python_one() -> None:
    assert not fastpath.COMPILED
    assert fastpath.speedups_module() is None
    assert command.compiled_decode_frame is None
    assert positions.FilePositions is positions.PyFilePositions
    assert positions.QueuePositions is positions.PyQueuePositions
    assert positions.QueueOffsets is dict
    assert v2_codec.COMPILED is None


# The answers of several values, read by name: each compiled struct sequence and its NamedTuple
# twin in fastpath.py.
RESULT_CLASSES = ("LaidOut", "NeedsRoom", "Refused", "IndexWritten", "UnitsCollected", "PlainCounts")


@pytest.mark.skipif(NO_COMPILED_TWINS, reason="the compiled twins are switched off or cannot be built here")
@pytest.mark.parametrize("name", RESULT_CLASSES)
def test_each_compiled_answer_has_its_python_twins_fields_in_the_same_order(name: str) -> None:
    compiled = getattr(importlib.import_module("data_plane.store._speedups"), name)
    python = getattr(fastpath, name)
    assert issubclass(compiled, tuple)
    assert compiled.__match_args__ == python._fields  # the visible fields: names and order
    assert compiled.n_fields == compiled.n_sequence_fields == len(python._fields)  # none hidden
    answer = compiled(range(len(python._fields)))
    assert [getattr(answer, f) for f in python._fields] == list(range(len(python._fields)))
