"""The access each request code needs — the one table (``ACCESS``: code → extractor).

An extractor reads a request and returns an ``Access``: the (resource kind, wire name, action)
triples a tenant principal must hold (``needs``), or a marker that the code is for operators and
brokers only (``privileged``), or that the broker checks a stored message's topic itself once it
has read it (``deferred``). Only tenant principals reach the extractors (operators and brokers
are allowed before), and only the heartbeat, lock, check-config and group-creation extractors
parse a JSON body.

Actions beyond the grant actions:

* ``NAMESPACE`` — the name must be in the principal's namespace; no grant needed (route lookups,
  the producer group of END_TRANSACTION). The default topic ``TBW102`` is open to route lookups.
* ``PRODUCER`` — a producer group: refused when it is in another tenant's namespace; unprefixed
  ones are accepted (stock clients always announce ``CLIENT_INNER_PRODUCER``; producer groups
  grant nothing on Orbit).

A missing required field yields the empty name, which belongs to no tenant and is refused.
Codes missing from the table are privileged (default deny for tenants). See docs/auth.md for the
table in prose.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Final, NamedTuple

from data_plane.remoting import bodies
from data_plane.remoting.codes import RequestCode as RC
from data_plane.remoting.command import RemotingCommand

NAMESPACE: Final = "namespace"
PRODUCER: Final = "producer"
PUBLISH: Final = "publish"
SUBSCRIBE: Final = "subscribe"
ADMIN: Final = "admin"

OPEN_SYSTEM_TOPICS: Final = frozenset(("TBW102",))  # route lookups only (auto-create through a send)


class Need(NamedTuple):
    kind: str  # "topic" | "group"
    wire: str  # the name as on the wire ("acme%orders", "%RETRY%acme%g", "TBW102")
    action: str  # publish | subscribe | admin | NAMESPACE | PRODUCER


class Access(NamedTuple):
    needs: tuple[Need, ...] = ()
    privileged: bool = False  # operators and brokers only
    deferred: str | None = None  # the action the broker checks on the stored message's topic


PRIVILEGED: Final = Access(privileged=True)
OPEN: Final = Access()  # any authenticated principal

Extractor = Callable[[RemotingCommand], Access]


class BodyError(ValueError):
    """A body the extractor needs is not what the code's body should be."""


def _ext(cmd: RemotingCommand) -> dict[str, str]:
    return cmd.ext_fields or {}


def _topic(field: str, action: str) -> Extractor:
    def extract(cmd: RemotingCommand) -> Access:
        return Access((Need("topic", _ext(cmd).get(field, ""), action),))

    return extract


def _group(field: str, action: str) -> Extractor:
    def extract(cmd: RemotingCommand) -> Access:
        return Access((Need("group", _ext(cmd).get(field, ""), action),))

    return extract


def _group_and_topic(group_field: str, topic_field: str, action: str, *, topic_optional: bool = False) -> Extractor:
    def extract(cmd: RemotingCommand) -> Access:
        ext = _ext(cmd)
        group = Need("group", ext.get(group_field, ""), action)
        topic = ext.get(topic_field)
        if topic is None and topic_optional:
            return Access((group,))
        return Access((Need("topic", topic or "", action), group))

    return extract


def _send_v2(cmd: RemotingCommand) -> Access:
    ext = _ext(cmd)
    return Access((Need("topic", ext.get("b") or ext.get("topic", ""), PUBLISH),))


def _body(cmd: RemotingCommand) -> dict[str, Any]:
    try:
        return bodies.loads_object(cmd.body_bytes())
    except ValueError as e:
        raise BodyError(f"the request body is not the JSON object this request carries: {e}") from None


def _str(v: Any) -> str:
    return v if isinstance(v, str) else ""


def _heartbeat_needs(data: dict[str, Any]) -> Iterator[Need]:
    for p in data.get("producerDataSet") or ():
        if isinstance(p, dict) and p.get("groupName"):
            yield Need("group", _str(p["groupName"]), PRODUCER)
    for c in data.get("consumerDataSet") or ():
        if not isinstance(c, dict):
            raise BodyError("a consumerDataSet entry is not an object")
        yield Need("group", _str(c.get("groupName")), SUBSCRIBE)
        for sd in c.get("subscriptionDataSet") or ():
            if not isinstance(sd, dict):
                raise BodyError("a subscriptionDataSet entry is not an object")
            yield Need("topic", _str(sd.get("topic")), SUBSCRIBE)


def _heartbeat(cmd: RemotingCommand) -> Access:
    """Every consumer group and subscribed topic → subscribe; producer groups → PRODUCER.
    A heartbeat naming no tenant resource (producers only, CLIENT_INNER_PRODUCER) is open."""
    return Access(tuple(dict.fromkeys(_heartbeat_needs(_body(cmd)))))


def _lock(cmd: RemotingCommand) -> Access:
    data = _body(cmd)
    needs = [Need("group", _str(data.get("consumerGroup")), SUBSCRIBE)]
    mq_set = data.get("mqSet") or []
    if not isinstance(mq_set, list):
        raise BodyError("mqSet is not a list")
    for mq in mq_set:
        if not isinstance(mq, dict):
            raise BodyError("an mqSet entry is not an object")
        needs.append(Need("topic", _str(mq.get("topic")), SUBSCRIBE))
    return Access(tuple(dict.fromkeys(needs)))


def _check_client_config(cmd: RemotingCommand) -> Access:
    data = _body(cmd)
    needs = [Need("group", _str(data.get("group")), SUBSCRIBE)]
    sd = data.get("subscriptionData")
    if isinstance(sd, dict) and sd.get("topic") is not None:
        needs.append(Need("topic", _str(sd.get("topic")), SUBSCRIBE))
    return Access(tuple(needs))


def _create_group(cmd: RemotingCommand) -> Access:
    return Access((Need("group", _str(_body(cmd).get("groupName")), ADMIN),))


def _unregister(cmd: RemotingCommand) -> Access:
    ext = _ext(cmd)
    needs = []
    if ext.get("producerGroup"):
        needs.append(Need("group", ext["producerGroup"], PRODUCER))
    if ext.get("consumerGroup"):
        needs.append(Need("group", ext["consumerGroup"], SUBSCRIBE))
    return Access(tuple(needs))


def _send_back(cmd: RemotingCommand) -> Access:
    """Subscribe on the group and on ``originTopic`` when given. The header does not say what is
    copied: the broker also checks the record at ``offset`` (data_plane/broker/send_back.py)."""
    ext = _ext(cmd)
    needs = [Need("group", ext.get("group", ""), SUBSCRIBE)]
    if ext.get("originTopic"):
        needs.append(Need("topic", ext["originTopic"], SUBSCRIBE))
    return Access(tuple(needs))


def _end_transaction(cmd: RemotingCommand) -> Access:
    return Access((Need("group", _ext(cmd).get("producerGroup", ""), NAMESPACE),), deferred=PUBLISH)


def _route(cmd: RemotingCommand) -> Access:
    return Access((Need("topic", _ext(cmd).get("topic", ""), NAMESPACE),))


def _view_by_id(cmd: RemotingCommand) -> Access:
    return Access(deferred=SUBSCRIBE)


def _privileged(cmd: RemotingCommand) -> Access:
    return PRIVILEGED


ACCESS: Final[dict[int, Extractor]] = {
    # --- messages in and out
    RC.SEND_MESSAGE: _topic("topic", PUBLISH),
    RC.SEND_MESSAGE_V2: _send_v2,
    RC.SEND_BATCH_MESSAGE: _send_v2,
    RC.PULL_MESSAGE: _group_and_topic("consumerGroup", "topic", SUBSCRIBE),
    RC.QUERY_MESSAGE: _topic("topic", SUBSCRIBE),
    # The broker answers only events of the message of this topic (and of retry / DLQ topics in
    # its namespace): subscribe on the topic is what tracing it takes (docs/filters_and_trace.md).
    RC.QUERY_MESSAGE_TRACE: _topic("topic", SUBSCRIBE),
    RC.VIEW_MESSAGE_BY_ID: _view_by_id,
    RC.CONSUMER_SEND_MSG_BACK: _send_back,
    RC.END_TRANSACTION: _end_transaction,
    # --- consumer offsets and queue positions
    RC.QUERY_CONSUMER_OFFSET: _group_and_topic("consumerGroup", "topic", SUBSCRIBE),
    RC.UPDATE_CONSUMER_OFFSET: _group_and_topic("consumerGroup", "topic", SUBSCRIBE),
    RC.SEARCH_OFFSET_BY_TIMESTAMP: _topic("topic", SUBSCRIBE),
    RC.GET_MAX_OFFSET: _topic("topic", SUBSCRIBE),
    RC.GET_MIN_OFFSET: _topic("topic", SUBSCRIBE),
    RC.GET_EARLIEST_MSG_STORETIME: _topic("topic", SUBSCRIBE),
    RC.GET_CONSUME_STATS: _group_and_topic("consumerGroup", "topic", SUBSCRIBE, topic_optional=True),
    # --- clients and groups
    RC.HEART_BEAT: _heartbeat,
    RC.UNREGISTER_CLIENT: _unregister,
    RC.GET_CONSUMER_LIST_BY_GROUP: _group("consumerGroup", SUBSCRIBE),
    RC.LOCK_BATCH_MQ: _lock,
    RC.UNLOCK_BATCH_MQ: _lock,
    RC.CHECK_CLIENT_CONFIG: _check_client_config,
    RC.GET_CONSUMER_RUNNING_INFO: _group("consumerGroup", ADMIN),
    # --- administration: tenants make and remove topics and groups through the control plane's
    # API (plan limits, placement); its reconciler applies them with an operator token. Letting a
    # tenant's admin grant do it here would skip the plan's topic and queue limits.
    RC.UPDATE_AND_CREATE_TOPIC: _privileged,
    RC.DELETE_TOPIC_IN_BROKER: _privileged,
    RC.DELETE_TOPIC_IN_NAMESRV: _privileged,
    RC.GET_TOPIC_STATS_INFO: _topic("topic", ADMIN),
    RC.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP: _privileged,
    RC.DELETE_SUBSCRIPTIONGROUP: _privileged,
    # --- name server
    RC.GET_ROUTEINFO_BY_TOPIC: _route,
    # --- listings and cluster-wide views: operators only (answers are not filtered per tenant)
    RC.GET_ALL_TOPIC_CONFIG: _privileged,
    RC.GET_TOPIC_NAME_LIST: _privileged,
    RC.GET_ALL_SUBSCRIPTIONGROUP_CONFIG: _privileged,
    RC.GET_ALL_CONSUMER_OFFSET: _privileged,
    RC.GET_BROKER_RUNTIME_INFO: _privileged,
    RC.GET_BROKER_CLUSTER_INFO: _privileged,
    RC.GET_ALL_TOPIC_LIST_FROM_NAMESERVER: _privileged,
    # --- between brokers, name servers and clients
    RC.REGISTER_BROKER: _privileged,
    RC.UNREGISTER_BROKER: _privileged,
    RC.CHECK_TRANSACTION_STATE: _privileged,
    RC.NOTIFY_CONSUMER_IDS_CHANGED: _privileged,
    RC.ORBIT_SYNC_TENANCY: _privileged,  # the control plane's snapshot: operator / broker tokens
}


def access_of(cmd: RemotingCommand) -> Access:
    """What a tenant principal needs for ``cmd`` (privileged for a code not in the table).
    Raises BodyError when a body it must read is malformed."""
    extract = ACCESS.get(cmd.code)
    if extract is None:
        return PRIVILEGED
    return extract(cmd)
