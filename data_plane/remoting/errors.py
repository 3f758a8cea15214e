"""Errors of the remoting layer, shared by the broker, the name server and the SDK.

One root (``RemotingError``); a timeout is also an ``asyncio.TimeoutError``. A server's
non-success answer is not an error here: it is a response with its code, which the SDK maps to
its own error classes (``sdk.errors.for_code``)."""

from __future__ import annotations

import asyncio


class RemotingError(Exception):
    """Root of every remoting failure."""


class RemotingConnectError(RemotingError):
    def __init__(self, addr: str, reason: str) -> None:
        super().__init__(f"connection to {addr} failed: {reason}")
        self.addr = addr


class RemotingTimeoutError(RemotingError, asyncio.TimeoutError):
    def __init__(self, addr: str, code: int, timeout_ms: int) -> None:
        super().__init__(f"request code {code} to {addr} had no answer within {timeout_ms} ms")
        self.addr = addr
        self.code = code
        self.timeout_ms = timeout_ms


class RemotingTooMuchRequestError(RemotingError):
    """Too many requests are waiting for answers on one connection."""


class HeaderError(ValueError):
    """A request's header lacks a field or has one of the wrong shape. The remark of the error
    response is the message."""
