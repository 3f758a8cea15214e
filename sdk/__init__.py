"""Orbit's client SDK: asyncio producers and consumers speaking RocketMQ 4.x's protocol, with a
thin blocking facade (``sdk.blocking``) for code without an event loop.

::

    from sdk import Message, Producer, PushConsumer, ConsumeResult

    async with Producer("my-producer", namesrv_addrs="127.0.0.1:9876") as producer:
        result = await producer.send(Message("orders", b"hello", tags="paid", keys="order-1"))

See ``sdk/README.md`` for the design; every module opens with what it holds. OpenTelemetry:
``Producer(..., telemetry=telemetry_from_env())`` and the same for consumers (``sdk.telemetry``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from sdk.blocking import BlockingProducer, BlockingPullConsumer
from sdk.client_instance import ClientInstance, Credentials
from sdk.consumer import ConsumeFrom, MessageModel
from sdk.credentials import (
    AccessKeyCredentials,
    AuthenticationError,
    ClientCredentials,
    StaticToken,
    TokenProvider,
    TokenUnavailableError,
)
from sdk.errors import (
    BrokerError,
    ClientStateError,
    ConnectionFailedError,
    IllegalArgumentError,
    IllegalMessageError,
    MessageTooLargeError,
    OrbitError,
    RequestTimeoutError,
    RouteNotFoundError,
)
from sdk.message import Message, MessageExt, MessageQueue, SendResult, SendStatus
from sdk.producer import Producer, QueueSelector, select_by_sharding_key
from sdk.pull_consumer import PullConsumer
from sdk.push_consumer import ConsumeResult, PushConsumer
from sdk.rebalance import AllocateAveragely, AllocateConsistentHash, AllocateStrategy
from sdk.subscription import MessageSelector, Subscription, parse_subscription
from sdk.transaction_producer import LocalTransactionState, TransactionProducer, TransactionSendResult

if TYPE_CHECKING:
    from data_plane.telemetry import Telemetry


def telemetry_from_env(
    service_name: str = "orbit-client", env: Mapping[str, str] | None = None, *, set_global: bool = True
) -> Telemetry | None:
    """``ORBIT_TELEMETRY=console|otlp`` → a ``Telemetry`` to pass to clients; unset or ``none`` → None
    (``sdk.telemetry.telemetry_from_env``; OpenTelemetry is imported only here, on first use)."""
    from sdk.telemetry import telemetry_from_env as from_env

    return from_env(service_name, env, set_global=set_global)


__all__ = [
    "AccessKeyCredentials",
    "AllocateAveragely",
    "AllocateConsistentHash",
    "AllocateStrategy",
    "AuthenticationError",
    "BlockingProducer",
    "BlockingPullConsumer",
    "BrokerError",
    "ClientCredentials",
    "ClientInstance",
    "ClientStateError",
    "ConnectionFailedError",
    "ConsumeFrom",
    "ConsumeResult",
    "Credentials",
    "IllegalArgumentError",
    "IllegalMessageError",
    "LocalTransactionState",
    "Message",
    "MessageExt",
    "MessageModel",
    "MessageQueue",
    "MessageSelector",
    "MessageTooLargeError",
    "OrbitError",
    "Producer",
    "PullConsumer",
    "PushConsumer",
    "QueueSelector",
    "RequestTimeoutError",
    "RouteNotFoundError",
    "SendResult",
    "SendStatus",
    "StaticToken",
    "Subscription",
    "TokenProvider",
    "TokenUnavailableError",
    "TransactionProducer",
    "TransactionSendResult",
    "parse_subscription",
    "select_by_sharding_key",
    "telemetry_from_env",
]
