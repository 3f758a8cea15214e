"""``MessageStore.entry`` (append_entry.py), the append entry points callers bind: the compiled
``_speedups.StoreEntry`` when the compiled Appender is in use, else ``PythonAppendEntry`` (the
store's own ``append`` and ``append_plain``). Both answer and store exactly what the methods do,
and ``put_count`` / ``put_bytes`` count what either stored, over restarts that change it."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import weakref
from pathlib import Path
from typing import Any

import pytest

from data_plane.broker.send import PLAIN_BATCH_SKIP
from data_plane.store import Message, MessageStore, PutMessageStatus, fastpath
from data_plane.store.append_entry import AppendEntry, PythonAppendEntry
from tests.conftest import ManualClock, small_config

ROOT = Path(__file__).resolve().parents[2]
BORN_HOST = bytes([10, 0, 0, 7, 0, 0, 0x27, 0x10])
COMPILED = fastpath.speedups_module() is not None
needs_compiled = pytest.mark.skipif(not COMPILED, reason="the compiled store module is not built")


def _messages() -> list[list[Message]]:
    """A queue's first message (the Python path makes its ConsumeQueue), then one the compiled
    Appender takes, then a batch."""
    props = {"TAGS": "TagA", "KEYS": "k1"}
    return [
        [Message("Orders", b"first", 0, properties=dict(props), born_timestamp=5, born_host=BORN_HOST)],
        [Message("Orders", b"second", 0, properties=dict(props), born_timestamp=6, born_host=BORN_HOST)],
        [
            Message("Orders", b"b%d" % i, 0, properties=dict(props), born_timestamp=7, born_host=BORN_HOST)
            for i in range(3)
        ],
    ]


def _answers(store: MessageStore, entry: AppendEntry) -> dict[str, Any]:
    """What ``entry`` answers for the appends of ``_messages`` and one plain message, and what
    the store then holds."""
    out: list[Any] = []
    for msgs in _messages():
        result, end = entry.append(msgs)
        a = result.append
        assert a is not None
        out.append([result.status.name, end, a.wrote_offset, a.wrote_bytes, a.queue_offset, a.msg_num, a.msg_ids])
    plain = entry.append_plain("Orders", 0, b"plain", b"TAGS\x01TagA\x02", 0, 0, 8, BORN_HOST, 0, PLAIN_BATCH_SKIP)
    out.append(list(plain) if isinstance(plain, tuple) else plain)
    store.write_staged()
    log = b"".join(bytes(mf.mv[: mf.wrote_position]) for mf in store.commit_log.mfq.files)
    return {"appends": out, "counts": [store.put_count, store.put_bytes], "log": log.hex()}


def _store(path: Path) -> MessageStore:
    store = MessageStore(small_config(str(path)), clock_ms=ManualClock())
    store.start()
    return store


PURE_PYTHON_SCRIPT = """
import json, sys
sys.path.insert(0, {root!r})
from pathlib import Path
from data_plane.store.append_entry import PythonAppendEntry
from tests.unit.test_append_entry import _answers, _store

store = _store(Path({path!r}))
try:
    assert type(store.entry) is PythonAppendEntry, type(store.entry)
    print(json.dumps(_answers(store, store.entry)))
finally:
    store.shutdown()
"""


def test_a_store_not_started_has_the_python_entry_which_refuses(tmp_path: Path) -> None:
    store = MessageStore(small_config(str(tmp_path / "s")))
    assert type(store.entry) is PythonAppendEntry
    result, end = store.entry.append([Message("T", b"x", 0)])
    assert (result.status, end) == (PutMessageStatus.SERVICE_NOT_AVAILABLE, -1)
    assert store.entry.append_plain("T", 0, b"x", b"", 0, 0, 1, BORN_HOST, 0, PLAIN_BATCH_SKIP) is None
    assert (store.entry.count, store.entry.bytes, store.put_count) == (0, 0, 0)


@needs_compiled
def test_a_started_store_with_the_compiled_module_has_the_compiled_entry(tmp_path: Path) -> None:
    store = _store(tmp_path / "s")
    try:
        assert type(store.entry) is fastpath.speedups_module().StoreEntry
    finally:
        store.shutdown()


@needs_compiled
def test_the_compiled_and_the_python_entry_answer_and_store_the_same(tmp_path: Path) -> None:
    compiled, python = _store(tmp_path / "compiled"), _store(tmp_path / "python")
    try:
        got = _answers(compiled, compiled.entry)
        want = _answers(python, PythonAppendEntry(python))
        assert got == want
        assert isinstance(got["appends"][-1], list)  # the plain message was taken (by the Appender)
        assert compiled.entry.count > 0  # the compiled entry stored (and counted) some of them
        assert python.entry.count == 0  # (only the methods were used there)
    finally:
        compiled.shutdown()
        python.shutdown()


def test_under_orbit_pure_python_the_entry_is_the_python_one_with_the_same_answers(tmp_path: Path) -> None:
    script = PURE_PYTHON_SCRIPT.format(root=str(ROOT), path=str(tmp_path / "pure"))
    env = {**os.environ, "ORBIT_PURE_PYTHON": "1"}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False, env=env, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    pure = json.loads(done.stdout)
    assert pure["appends"][-1] is None  # append_plain: only the compiled Appender takes it
    here = _store(tmp_path / "here")
    try:
        want = _answers(here, here.entry)
    finally:
        here.shutdown()
    # The same appends, records and counts as this process's entry (compiled or not); the plain
    # message, not taken there, is the one difference.
    assert pure["appends"][:-1] == want["appends"][:-1]
    if want["appends"][-1] is None:
        assert pure == want
    else:
        assert pure["counts"][0] == want["counts"][0] - 1
        assert want["log"].startswith(pure["log"])


@needs_compiled
def test_a_restart_without_the_compiled_path_gets_the_python_entry_and_keeps_the_counts(tmp_path: Path) -> None:
    store = _store(tmp_path / "s")
    try:
        for msgs in _messages():
            assert store.entry.append(msgs)[0].ok
        counts = (store.put_count, store.put_bytes)
        assert store.entry.count > 0
        store.shutdown()
        assert fastpath.use_compiled(False) is False
        try:
            store.start()
            assert type(store.entry) is PythonAppendEntry
            assert (store.put_count, store.put_bytes) == counts  # the compiled entry's counts carried over
            assert store.entry.append([Message("Orders", b"again", 0)])[0].ok
            assert store.put_count == counts[0] + 1
            store.shutdown()
        finally:
            fastpath.use_compiled(True)
        store.start()
        assert type(store.entry) is fastpath.speedups_module().StoreEntry
        assert store.put_count == counts[0] + 1
    finally:
        store.shutdown()


def test_the_python_entry_holds_its_store_weakly(tmp_path: Path) -> None:
    store = MessageStore(small_config(str(tmp_path / "s")))
    entry = PythonAppendEntry(store)
    ref = weakref.ref(store)
    del store
    gc.collect()
    assert ref() is None
    with pytest.raises(RuntimeError, match="gone"):
        entry.append([Message("T", b"y", 0)])
