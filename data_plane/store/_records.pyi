# Types of the compiled SDK record codecs (_records.c); the Python twin is sdk.record_codec.PythonRecordCodec.
from collections.abc import Callable, Iterator
from typing import Any

RECORD_FIELDS: tuple[str, ...]

class Decoded(tuple[list[Any], int]):
    @property
    def messages(self) -> list[Any]: ...
    @property
    def compressed(self) -> int: ...

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
) -> Decoded: ...
def plain_batch_body(msgs: list[Any], unique_ids: list[str], cls: type, /) -> bytes | None: ...
