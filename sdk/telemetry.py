"""OpenTelemetry in the SDK: what producers and consumers do when given a ``Telemetry``.

::

    from sdk import Producer, PushConsumer, telemetry_from_env

    tel = telemetry_from_env("billing")                 # ORBIT_TELEMETRY=console|otlp, else None
    producer = Producer("billing-p", namesrv_addrs=..., telemetry=tel)
    consumer = PushConsumer("billing-c", namesrv_addrs=..., telemetry=tel)

Off (``telemetry=None``, the default) costs one ``is None`` check per send, listener call or poll;
this module (and OpenTelemetry) is imported only once a client is given a telemetry that is on.

On:

* ``Producer.send`` / ``send_oneway`` / ``send_batch`` / ``send_async``: a PRODUCER span
  ``send <topic>`` around the whole send (retries included); its W3C context is written into the
  sent message's properties as ``traceparent`` / ``tracestate`` (the caller's ``Message`` is not
  changed: a copy with the two properties is sent). Neither name is one of RocketMQ's reserved
  properties (``sdk.message.SYSTEM_PROPERTIES``); a user property of the same name is replaced.
* ``PushConsumer``: a CONSUMER span ``process <topic>`` around each listener call — the child of
  the message's producer span (one message), or a new trace linked to each message's producer
  span (a batch); a result other than SUCCESS or an exception marks it as an error.
* ``PullConsumer.poll``: a CLIENT span ``receive <topic>`` per poll that returned messages,
  covering the poll's wait, under the caller's current span and linked to the producers' spans.

Attributes follow the messaging semantic conventions (``data_plane.telemetry``).
"""

from __future__ import annotations

import copy
import logging
import os
import threading
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager

from opentelemetry.trace import Span, StatusCode
from opentelemetry.util.types import AttributeValue

from data_plane.telemetry import (
    ATTR_ERROR_TYPE,
    ATTR_PARTITION,
    TELEMETRY_SETTINGS,
    Telemetry,
    consume_batch_span,
    send_span,
    setup_telemetry,
)
from sdk.message import Message, MessageExt, SendResult

log = logging.getLogger(__name__)

ENV_VAR = "ORBIT_TELEMETRY"
DEFAULT_SERVICE_NAME = "orbit-client"
ATTR_CONSUMPTION_MODEL = "messaging.rocketmq.consumption_model"

_from_env: dict[tuple[str, str], Telemetry] = {}
_from_env_lock = threading.Lock()


def telemetry_from_env(
    service_name: str = DEFAULT_SERVICE_NAME, env: Mapping[str, str] | None = None, *, set_global: bool = True
) -> Telemetry | None:
    """The process's switch: ``ORBIT_TELEMETRY=console`` (spans as JSON on stdout, metrics every
    60 s) or ``otlp`` (OTLP/HTTP, configured by the standard ``OTEL_EXPORTER_OTLP_*`` variables)
    gives a ``Telemetry`` to pass to clients; unset, ``none`` or ``OTEL_SDK_DISABLED=true`` gives
    None (off). One ``Telemetry`` per (service name, exporter) and process: later calls return it;
    with ``set_global`` the first one installs its providers as OpenTelemetry's globals."""
    env = os.environ if env is None else env
    raw = env.get(ENV_VAR, "").strip().lower()
    if not raw or raw == "none" or env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    if raw not in TELEMETRY_SETTINGS:
        log.warning("%s=%r is not console, otlp or none: telemetry stays off", ENV_VAR, raw)
        return None
    key = (service_name, raw)
    with _from_env_lock:
        tel = _from_env.get(key)
        if tel is None:
            tel = setup_telemetry(service_name, exporter=raw, set_global=set_global)
            _from_env[key] = tel
    return tel


def enabled_or_none(tel: Telemetry | None) -> Telemetry | None:
    """What a client keeps: None unless the telemetry is on (so its hot paths check ``is None``)."""
    return tel if tel is not None and tel.enabled else None


# --- producers ----------------------------------------------------------------------------------
def with_properties(msg: Message, extra: Mapping[str, str]) -> Message:
    """A copy of ``msg`` whose properties also hold ``extra`` (``msg`` itself is not changed)."""
    if not extra:
        return msg
    out = copy.copy(msg)
    out.properties = {**msg.properties, **extra}
    return out


def producer_span(
    tel: Telemetry, msg: Message, carrier: dict[str, str], *, message_id: str, batch_size: int | None = None
) -> AbstractContextManager[Span]:
    """The PRODUCER span of one send; inside it ``carrier`` holds the span's trace context."""
    return send_span(
        tel,
        msg.topic,
        properties=carrier,
        message_id=message_id if batch_size is None else None,
        tag=msg.tags,
        keys=msg.keys if batch_size is None else None,
        batch_size=batch_size,
        body_size=len(msg.body) if batch_size is None else None,
    )


def record_send_result(span: Span, result: SendResult) -> None:
    span.set_attribute(ATTR_PARTITION, str(result.message_queue.queue_id))
    if result.status.value != "SEND_OK":  # stored, but not as durable as asked
        span.set_attribute("messaging.rocketmq.send.status", result.status.value)


def record_error(span: Span, error: BaseException) -> None:
    """``error.type`` (the exception's class); the span's ``with`` records the exception itself."""
    span.set_attribute(ATTR_ERROR_TYPE, type(error).__name__)


# --- consumers ----------------------------------------------------------------------------------
def consumer_span(
    tel: Telemetry,
    msgs: Sequence[MessageExt],
    group: str,
    *,
    operation: str,
    consumption_model: str,
    start_time: int | None = None,
) -> AbstractContextManager[Span]:
    """The span of one listener call (``process``) or one poll (``receive``)."""
    extra: dict[str, AttributeValue] = {ATTR_CONSUMPTION_MODEL: consumption_model.lower()}
    if len({m.queue_id for m in msgs}) == 1:
        extra[ATTR_PARTITION] = str(msgs[0].queue_id)
    return consume_batch_span(
        tel,
        msgs[0].topic,
        [m.properties for m in msgs],
        operation="process" if operation == "process" else "receive",
        consumer_group=group,
        message_id=msgs[0].msg_id if len(msgs) == 1 else None,
        as_child=operation == "process",
        start_time=start_time,
        extra=extra,
    )


def record_consume_result(span: Span, result: str) -> None:
    """A listener's result other than SUCCESS marks the span as failed (``error.type`` = it)."""
    if result != "SUCCESS":
        span.set_attribute(ATTR_ERROR_TYPE, result)
        span.set_status(StatusCode.ERROR, result)
