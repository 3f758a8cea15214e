"""The SDK's errors: one root, ``OrbitError``, and one class per failure the caller can act on.

Class attributes drive the SDK's own decisions (aiokafka style):

* ``retriable`` — another attempt (on another broker, after a route refresh) may succeed;
  the producer retries these, consumers back off and pull again.
* ``invalid_metadata`` — the cached route is probably stale; refresh it before retrying.

Errors a broker answers carry the wire ``code`` and the broker's ``remark``. The code → class
table (``for_code``) is built from the subclasses' ``code`` attributes, so the wire code and
the exception never drift apart. Failures of the transport (``data_plane.remoting.errors``)
are translated once, by ``from_remoting``.
"""

from __future__ import annotations

import re
from typing import ClassVar

from data_plane.remoting.codes import ResponseCode
from data_plane.remoting.errors import (
    RemotingConnectError,
    RemotingError,
    RemotingTimeoutError,
    RemotingTooMuchRequestError,
)

_RETRY_AFTER = re.compile(r"retry-after-ms=(\d{1,9})")
_QUOTA_RATE = re.compile(r"quota-msgs-per-s=([0-9]{1,9}(?:\.[0-9]{1,6})?)")
# RocketMQ's (and Orbit's) remark for a queue id a topic does not have for the request:
# "request queueId[5] is illegal, ..." (send), "queueId[5] is illegal, topic:[...] ..." (pull).
_QUEUE_ILLEGAL = re.compile(r"queueId\[-?\d{1,10}\] is illegal")
_SENDING_FORBIDDEN = "sending is forbidden"  # RocketMQ's remark: the topic's perm lacks WRITE


class OrbitError(Exception):
    """Root of every error the SDK raises."""

    retriable: ClassVar[bool] = False
    invalid_metadata: ClassVar[bool] = False
    code: int | None = None  # the wire code, for errors a server answers

    def __init__(self, message: str = "", *, remark: str = "", addr: str = "") -> None:
        super().__init__(message or remark or type(self).__name__)
        self.remark = remark
        self.addr = addr


# --- client-side errors -------------------------------------------------------------------------
class ClientStateError(OrbitError):
    """The producer or consumer is not in a state to do this (not started, already shut down,
    started twice, a group registered twice in one client instance)."""


class IllegalArgumentError(OrbitError, ValueError):
    """An option or argument is invalid (bad topic name, empty batch, unknown queue)."""


class IllegalMessageError(IllegalArgumentError):
    """The message cannot be sent as it is. A broker answers MESSAGE_ILLEGAL (13) for the same."""

    code = ResponseCode.MESSAGE_ILLEGAL


class MessageTooLargeError(IllegalMessageError):
    """The message (or batch) body is over the producer's ``max_message_bytes``."""

    def __init__(self, size: int, max_bytes: int) -> None:
        super().__init__(f"message body is {size} bytes, over the {max_bytes}-byte limit (max_message_bytes)")
        self.size = size
        self.max_bytes = max_bytes


class RouteNotFoundError(OrbitError):
    """No name server knows the topic (and it cannot be auto-created through TBW102)."""

    retriable = True
    invalid_metadata = True

    def __init__(self, topic: str, detail: str = "", *, missing: bool = False) -> None:
        if missing:  # the name servers do not know it: most often a typo, or not created yet
            why = f" ({detail})" if detail else ""
            text = f"no route for topic {topic!r}: topic {topic!r} does not exist{why}; {create_topic_hint(topic)}"
        else:
            text = f"no route for topic {topic!r}{': ' + detail if detail else ''}"
        super().__init__(text)
        self.topic = topic
        self.missing = missing


def create_topic_hint(topic: str) -> str:
    """How a topic that does not exist is created: a tenant's (``tenant%name``) through the
    control plane's API, any topic with the CLI."""
    tenant, sep, _ = topic.partition("%")
    if sep and tenant:
        return f"create it with the API (POST /v1/tenants/{tenant}/topics) or `orbit topic create`"
    return "create it with `orbit topic create`"


class BrokerNotFoundError(OrbitError):
    """The route names a broker whose address is unknown (no master, or it left)."""

    retriable = True
    invalid_metadata = True


# --- transport errors ---------------------------------------------------------------------------
class ConnectionFailedError(OrbitError):
    """A TCP connection to a name server or broker could not be made, or closed mid-request."""

    retriable = True


class RequestTimeoutError(OrbitError, TimeoutError):
    """No answer within the request's timeout. Also a ``TimeoutError`` (= ``asyncio.TimeoutError``)."""

    retriable = True


class TooManyRequestsError(OrbitError):
    """Too many of our requests already wait for answers on one connection."""

    retriable = True


# --- errors a broker or name server answers -----------------------------------------------------
class BrokerError(OrbitError):
    """A server answered with a failure code. ``code`` and ``remark`` are the wire's."""

    def __init__(self, message: str = "", *, remark: str = "", addr: str = "", code: int | None = None) -> None:
        where = f"{addr}: " if addr else ""
        wire = code if code is not None else type(self).code
        super().__init__(message or f"{where}code {wire}: {remark}".rstrip(": "), remark=remark, addr=addr)
        if code is not None:
            self.code = code  # UnknownBrokerError instances carry their own


class BrokerSystemError(BrokerError):
    code = ResponseCode.SYSTEM_ERROR
    retriable = True


class QueueNotServedError(BrokerSystemError):
    """The broker has no such queue for this request (SYSTEM_ERROR "queueId[N] is illegal"): a
    send to a queue id at or above the topic's writeQueueNums there (the queue is read-only or
    gone), a pull at or above its readQueueNums (gone). The topic's queues changed since the
    route was read: the producer sends elsewhere and refreshes the route, a consumer waits for
    the refreshed route to drop the queue."""

    invalid_metadata = True


class SystemBusyError(BrokerError):
    """The broker sheds load (flow control, page cache busy); back off and retry."""

    code = ResponseCode.SYSTEM_BUSY
    retriable = True


class FlowControlError(BrokerError):
    """The tenant is over its quota on this broker. ``retry_after_ms`` is the broker's hint
    (from the remark's ``retry-after-ms=<n>``); the producer and consumers wait that long and
    retry by themselves, within their deadlines."""

    code = ResponseCode.FLOW_CONTROL
    retriable = True
    DEFAULT_RETRY_AFTER_MS = 100
    local = False  # raised by the client's pacer (nothing was sent), not answered by a broker

    @property
    def retry_after_ms(self) -> int:
        m = _RETRY_AFTER.search(self.remark)
        return int(m.group(1)) if m else self.DEFAULT_RETRY_AFTER_MS

    @property
    def quota_msgs_per_s(self) -> float | None:
        """The tenant's publish rate on the broker, when its answer names it."""
        m = _QUOTA_RATE.search(self.remark)
        return float(m.group(1)) if m else None

    @classmethod
    def held_back(cls, addr: str) -> FlowControlError:
        """The client's own refusal: the pace of ``addr`` (sdk/pacer.py) has no slot for the
        send before its deadline, so it was not sent."""
        remark = (
            f"[TOO_MANY_REQUESTS] held back by the client: broker {addr} paces this tenant's sends "
            "to its quota and has no slot for this one within send_timeout_ms"
        )
        e = cls(remark, remark=remark, addr=addr)
        e.local = True
        return e


class RequestCodeNotSupportedError(BrokerError):
    code = ResponseCode.REQUEST_CODE_NOT_SUPPORTED


class ServiceNotAvailableError(BrokerError):
    """The broker does not take writes now (shutting down, disk full, slave)."""

    code = ResponseCode.SERVICE_NOT_AVAILABLE
    retriable = True


class VersionNotSupportedError(BrokerError):
    code = ResponseCode.VERSION_NOT_SUPPORTED


class NoPermissionError(BrokerError):
    """The topic refuses this operation (permission bits or access control)."""

    code = ResponseCode.NO_PERMISSION


class TopicNotWritableError(NoPermissionError):
    """The topic takes no writes on this broker now (NO_PERMISSION "the topic[...] sending is
    forbidden": its perm lacks WRITE there, as when a broker group is being drained). Retriable
    on the topic's other brokers, after a route refresh."""

    retriable = True
    invalid_metadata = True


class TopicNotExistError(BrokerError):
    code = ResponseCode.TOPIC_NOT_EXIST
    retriable = True
    invalid_metadata = True


class TopicExistAlreadyError(BrokerError):
    code = ResponseCode.TOPIC_EXIST_ALREADY


class SubscriptionParseFailedError(BrokerError):
    code = ResponseCode.SUBSCRIPTION_PARSE_FAILED


class SubscriptionNotExistError(BrokerError):
    code = ResponseCode.SUBSCRIPTION_NOT_EXIST
    retriable = True


class SubscriptionNotLatestError(BrokerError):
    code = ResponseCode.SUBSCRIPTION_NOT_LATEST
    retriable = True


class SubscriptionGroupNotExistError(BrokerError):
    code = ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST


class ConsumerNotOnlineError(BrokerError):
    code = ResponseCode.CONSUMER_NOT_ONLINE
    retriable = True


class UnknownBrokerError(BrokerError):
    """A failure code this SDK has no class for; ``code`` is the wire's."""


def _subclasses(cls: type[OrbitError]) -> list[type[OrbitError]]:
    out: list[type[OrbitError]] = []
    for sub in cls.__subclasses__():
        out.append(sub)
        out.extend(_subclasses(sub))
    return out


def _code_table() -> dict[int, type[OrbitError]]:
    table: dict[int, type[OrbitError]] = {}
    for cls in _subclasses(OrbitError):
        code = cls.__dict__.get("code")
        if code is not None:
            assert code not in table, f"two error classes for code {code}"
            table[int(code)] = cls
    return table


CODE_TO_ERROR: dict[int, type[OrbitError]] = _code_table()


def for_code(code: int, remark: str | None = None, addr: str = "") -> OrbitError:
    """The exception for a failure code a server answered."""
    cls = CODE_TO_ERROR.get(code)
    remark = remark or ""
    if code == ResponseCode.SYSTEM_ERROR and _QUEUE_ILLEGAL.search(remark):
        cls = QueueNotServedError
    elif code == ResponseCode.NO_PERMISSION and _SENDING_FORBIDDEN in remark:
        cls = TopicNotWritableError
    where = f"{addr}: " if addr else ""
    if cls is None or not issubclass(cls, BrokerError):
        if cls is not None:  # a client-side class that shares the code (MESSAGE_ILLEGAL)
            return cls(f"{where}code {code}: {remark}".rstrip(": "), remark=remark, addr=addr)
        return UnknownBrokerError(remark=remark, addr=addr, code=code)
    return cls(remark=remark, addr=addr)


def from_remoting(e: RemotingError) -> OrbitError:
    """Translate a transport failure into the SDK's hierarchy (raise it ``from e``)."""
    if isinstance(e, RemotingTimeoutError):
        return RequestTimeoutError(str(e), addr=e.addr)
    if isinstance(e, RemotingConnectError):
        return ConnectionFailedError(str(e), addr=e.addr)
    if isinstance(e, RemotingTooMuchRequestError):
        return TooManyRequestsError(str(e))
    return ConnectionFailedError(str(e))
