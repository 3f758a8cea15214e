"""Orbit's message store: CommitLog, ConsumeQueues and IndexFiles on mmap'd files.

``MessageStore`` is the entry point; ``StoreConfig`` holds every setting. See
docs/store.md for the design and the on-disk formats.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from data_plane.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from data_plane.store.config import FlushDiskType, StoreConfig
    from data_plane.store.message import Message, StoredMessage, decode_message_id, encode_message_id, pack_host
    from data_plane.store.message_store import MessageStore
    from data_plane.store.status import GetMessageResult, GetMessageStatus, PutMessageResult, PutMessageStatus

# Each name's module, loaded when the name is first used: a client that needs only the record
# codec (``data_plane.store.message``, the SDK) does not load the store engine with it.
_EXPORTS = {
    "FlushDiskType": "config",
    "StoreConfig": "config",
    "Message": "message",
    "StoredMessage": "message",
    "decode_message_id": "message",
    "encode_message_id": "message",
    "pack_host": "message",
    "MessageStore": "message_store",
    "GetMessageResult": "status",
    "GetMessageStatus": "status",
    "PutMessageResult": "status",
    "PutMessageStatus": "status",
}


if not TYPE_CHECKING:  # (the checker sees the imports above, and flags a name that is not there)
    __getattr__ = lazy_exports(__name__, _EXPORTS, globals())


__all__ = [
    "FlushDiskType",
    "GetMessageResult",
    "GetMessageStatus",
    "Message",
    "MessageStore",
    "PutMessageResult",
    "PutMessageStatus",
    "StoreConfig",
    "StoredMessage",
    "decode_message_id",
    "encode_message_id",
    "pack_host",
]
