# Types of the compiled SDK record codecs (_records.c); the Python twins are in sdk/protocol.py
# (decode_messages, py_batch_body) and sdk/message.py (py_unique_ids, decode_properties).
from collections.abc import Callable, Iterator
from typing import Any

RECORD_FIELDS: tuple[str, ...]

def unique_ids(head: str, counter: Iterator[int], n: int, /) -> list[str]: ...
def properties_dict(raw: bytes, /) -> dict[str, str]: ...
def decode_records(
    body: bytes | memoryview,
    cls: type,
    broker_name: str,
    check_crc: bool,
    topics: dict[bytes, str],
    hosts: dict[bytes, tuple[str, int]],
    host_of: Callable[[bytes], tuple[str, int]],
    /,
) -> tuple[list[Any], int]: ...
def plain_batch_body(msgs: list[Any], unique_ids: list[str], cls: type, /) -> bytes | None: ...
