# Types of the compiled SendMessageRequest reading (_send_request.c); the Python twin is send_request.PythonSendRequest.

def plain_batch(
    payload: bytes | memoryview, max_messages: int, max_body: int, now_ms: int, /
) -> tuple[str, str, bytes, list[str], int, int] | None: ...
