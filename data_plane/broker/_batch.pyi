# Types of the compiled batch decoding (_batch.c); the Python twin is batch_decode.PythonBatchDecoder.
from typing import Any

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
) -> list[Any] | None: ...
