# Types of the gRPC endpoint's compiled protobuf conversions (_v2_codec.c); the Python twin is v2_codec.PythonV2Codec.
from typing import Any

def plain_batch(
    payload: bytes | memoryview, max_messages: int, max_body: int, now_ms: int, /
) -> tuple[str, str, bytes, list[str], int, int] | None: ...
def received_records(
    records: list[Any],
    topic: str,
    namespace: str,
    name: str,
    queue_id: int,
    seq: int,
    attempt: int,
    invisible_ms: int,
    system_names: frozenset[str],
    /,
) -> list[bytes | None]: ...
def lease_scan(
    records: list[Any],
    topic: str,
    leases: dict[int, Any],
    done: set[int],
    tags: frozenset[str] | None,
    want: int,
    lease: Any,
    /,
) -> tuple[list[int], list[Any], list[int], int, int, int]: ...
def md5_upper(data: bytes | memoryview, /) -> str: ...
