"""Requests about clients: HEART_BEAT (34), UNREGISTER_CLIENT (35),
GET_CONSUMER_LIST_BY_GROUP (38), LOCK_BATCH_MQ (41), UNLOCK_BATCH_MQ (42), CHECK_CLIENT_CONFIG (46)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from data_plane.remoting import bodies
from data_plane.remoting.codes import ResponseCode
from data_plane.remoting.command import RemotingCommand
from data_plane.remoting.connection import Connection
from data_plane.remoting.errors import HeaderError
from data_plane.remoting.headers import field_opt_str, field_str

if TYPE_CHECKING:
    from data_plane.broker.broker import Broker

MAX_LOCK_BATCH = 4096


def _client_id(v: Any) -> str:
    if not isinstance(v, str) or not v or len(v) > 512:
        raise HeaderError("clientID is missing or longer than 512 characters")
    return v


class ClientProcessor:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker

    def heartbeat(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        data = bodies.loads_object(cmd.body_bytes())
        client_id = _client_id(data.get("clientID"))
        conn.attrs["client_id"] = client_id
        broker = self.broker
        for p in data.get("producerDataSet") or ():
            if isinstance(p, dict) and p.get("groupName"):
                try:
                    broker.clients.register_producer(conn, client_id, str(p["groupName"]))
                except ValueError as e:
                    return cmd.response(ResponseCode.SYSTEM_BUSY, str(e))
        for c in data.get("consumerDataSet") or ():
            if not isinstance(c, dict) or not c.get("groupName"):
                continue
            group = str(c["groupName"])
            g = broker.groups.find(group)
            if g is None:
                return cmd.response(ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST, f"subscription group {group} not exist")
            pop = broker.pop
            if pop is not None and group in pop.groups:
                return cmd.response(
                    ResponseCode.NO_PERMISSION,
                    f"group {group} consumes by lease (RocketMQ 5 clients) on this broker: a group consumes "
                    "either by pull (4.x) or by lease (5.x), not both",
                )
            if c.get("messageModel", "CLUSTERING") == "CLUSTERING" and broker.is_master:
                try:
                    if broker.topics.create_retry_topic(group):
                        broker.topics_changed()
                except ValueError as e:
                    return cmd.response(ResponseCode.SUBSCRIPTION_PARSE_FAILED, str(e))
            for sd in c.get("subscriptionDataSet") or ():  # SQL92: refused here, never at delivery
                why = broker.consumer_filter.check_subscription_data(group, sd)
                if why is not None:
                    return cmd.response(ResponseCode.SUBSCRIPTION_PARSE_FAILED, why)
            try:
                changed = broker.clients.register_consumer(conn, client_id, c)
            except ValueError as e:
                return cmd.response(ResponseCode.SYSTEM_BUSY, str(e))
            if changed:
                broker.clients.notify_ids_changed(group)
        return cmd.response(ResponseCode.SUCCESS)

    def unregister(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        ext = cmd.ext_fields
        field_str(ext, "clientID")
        clients = self.broker.clients
        producer = field_opt_str(ext, "producerGroup")
        if producer:
            clients.unregister_producer(conn, producer)
        consumer = field_opt_str(ext, "consumerGroup")
        if consumer and clients.unregister_consumer(conn, consumer):
            clients.notify_ids_changed(consumer)
        return cmd.response(ResponseCode.SUCCESS)

    def consumer_list(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        group = field_str(cmd.ext_fields, "consumerGroup")
        info = self.broker.clients.find_group(group)
        if info is None or not info.members:
            return cmd.response(ResponseCode.SYSTEM_ERROR, f"no consumer for this group, {group}")
        return cmd.response(ResponseCode.SUCCESS, body=bodies.dumps({"consumerIdList": info.client_ids()}))

    def _lock_request(self, cmd: RemotingCommand) -> tuple[str, str, list[tuple[str, str, int]]]:
        data = bodies.loads_object(cmd.body_bytes())
        group = data.get("consumerGroup")
        if not isinstance(group, str) or not group:
            raise HeaderError("consumerGroup is missing from the lock request")
        client_id = _client_id(data.get("clientId"))
        mq_set = data.get("mqSet") or []
        if not isinstance(mq_set, list) or len(mq_set) > MAX_LOCK_BATCH:
            raise HeaderError(f"mqSet must be a list of at most {MAX_LOCK_BATCH} queues")
        queues = []
        for v in mq_set:
            mq = bodies.message_queue(v)
            queues.append((mq["topic"], mq["brokerName"], mq["queueId"]))
        return group, client_id, queues

    def lock_batch(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        group, client_id, queues = self._lock_request(cmd)
        held = self.broker.locks.try_lock_batch(group, queues, client_id)
        body = {"lockOKMQSet": [{"topic": t, "brokerName": b, "queueId": q} for t, b, q in held]}
        return cmd.response(ResponseCode.SUCCESS, body=bodies.dumps(body))

    def unlock_batch(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        group, client_id, queues = self._lock_request(cmd)
        self.broker.locks.unlock_batch(group, queues, client_id)
        return cmd.response(ResponseCode.SUCCESS)

    def check_client_config(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        data = bodies.loads_object(cmd.body_bytes())
        sd = data.get("subscriptionData") or {}
        why = self.broker.consumer_filter.check_subscription_data(str(data.get("group") or ""), sd)
        if why is not None:  # a bad SQL92 expression: the remark names the position (consumer_filter.py)
            return cmd.response(ResponseCode.SUBSCRIPTION_PARSE_FAILED, why)
        return cmd.response(ResponseCode.SUCCESS)
