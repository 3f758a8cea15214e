"""Orbit's message store: CommitLog, ConsumeQueues and IndexFiles on mmap'd files.

``MessageStore`` is the entry point; ``StoreConfig`` holds every setting. See
docs/store.md for the design and the on-disk formats.
"""

from data_plane.store.config import FlushDiskType, StoreConfig
from data_plane.store.message import Message, StoredMessage, decode_message_id, encode_message_id, pack_host
from data_plane.store.message_store import MessageStore
from data_plane.store.status import GetMessageResult, GetMessageStatus, PutMessageResult, PutMessageStatus

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
