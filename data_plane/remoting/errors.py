"""Errors of the remoting layer, shared by the broker, the name server and the SDK.

One root (``RemotingError``); a timeout is also an ``asyncio.TimeoutError``. A broker's
non-success answer becomes ``BrokerResponseError`` carrying the wire code and remark."""

from __future__ import annotations

import asyncio


class RemotingError(Exception):
    """Root of every remoting failure."""

    retriable = True


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


class BrokerResponseError(RemotingError):
    """A server answered with a non-success code."""

    def __init__(self, code: int, remark: str | None, addr: str = "") -> None:
        super().__init__(f"{addr + ': ' if addr else ''}code {code}: {remark or ''}".strip())
        self.code = code
        self.remark = remark or ""
        self.addr = addr
        # System busy / flush timeouts are worth another try; bad input is not.
        self.retriable = code in (1, 2, 10, 11, 12, 14, 17, 204, 215)
