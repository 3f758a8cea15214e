"""A SEND_BATCH_MESSAGE body (layout in remoting/bodies.py) to the Messages the store takes.

Two implementations satisfy ``data_plane.store.compiled.BatchDecoder``, call for call: the
compiled ``data_plane/broker/_batch.c`` (used when built and ``ORBIT_PURE_PYTHON`` is not set)
and ``PythonBatchDecoder`` here, the reference. The compiled one answers None for a body it does
not take (not well formed, or more messages than allowed) and leaves the error to the Python one.
"""

from __future__ import annotations

from typing import Any

from data_plane.remoting.bodies import MAX_BATCH_MESSAGES, decode_batch
from data_plane.remoting.errors import HeaderError
from data_plane.store.compiled import BatchDecoder, batch
from data_plane.store.message import Message, decode_properties


class PythonBatchDecoder:
    """The pure-Python ``BatchDecoder``."""

    @staticmethod
    def batch_messages(
        body: bytes | memoryview,
        cls: type,
        topic: str,
        queue_id: int,
        sys_flag: int,
        born_ts: int,
        born_host: bytes,
        reconsume: int,
        max_messages: int,
        /,
    ) -> list[Any]:
        """The messages of ``body``, each a ``cls`` with the request's topic, queue, flags, birth
        and reconsume count. Raises HeaderError, saying what is wrong."""
        msgs = []
        for flag, b, praw in decode_batch(body, max_messages):
            try:
                p = decode_properties(praw)
            except ValueError as e:
                raise HeaderError(f"a batch message's properties are malformed: {e}") from None
            msgs.append(cls(topic, b, queue_id, flag, p, sys_flag, born_ts, born_host, reconsume))
        return msgs


PYTHON: BatchDecoder = PythonBatchDecoder()  # (mypy checks the twin against the Protocol)
_compiled = batch()


def batch_messages(
    body: bytes | memoryview, topic: str, queue_id: int, sys_flag: int, born_ts: int, born_host: bytes, reconsume: int
) -> list[Message]:
    """The messages of a SEND_BATCH_MESSAGE body, by the compiled decoder when it is built and
    takes the body, else by the Python one (whose HeaderError says what is wrong)."""
    if _compiled is not None:
        msgs: list[Message] | None = _compiled.batch_messages(
            body, Message, topic, queue_id, sys_flag, born_ts, born_host, reconsume, MAX_BATCH_MESSAGES
        )
        if msgs is not None:
            return msgs
    return py_batch_messages(body, topic, queue_id, sys_flag, born_ts, born_host, reconsume)


def py_batch_messages(
    body: bytes | memoryview, topic: str, queue_id: int, sys_flag: int, born_ts: int, born_host: bytes, reconsume: int
) -> list[Message]:
    """``batch_messages`` by the Python decoder alone (the reference the twin tests compare with)."""
    return PythonBatchDecoder.batch_messages(
        body, Message, topic, queue_id, sys_flag, born_ts, born_host, reconsume, MAX_BATCH_MESSAGES
    )
