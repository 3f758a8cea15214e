# Types of the gRPC endpoint's compiled protobuf conversions (_v2_codec.c); the Python twin is v2_codec.PythonV2Codec.
from typing import Any

def plain_batch(
    payload: bytes | memoryview, max_messages: int, max_body: int, now_ms: int, /
) -> tuple[str, str, bytes, list[str], int, int] | None: ...
def received_message(
    rec: Any,
    message_id: str,
    digest: str,
    namespace: str,
    name: str,
    handle: str,
    attempt: int,
    invisible_ms: int,
    system_names: frozenset[str],
    /,
) -> bytes | None: ...
