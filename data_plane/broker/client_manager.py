"""Clients the broker knows from their heartbeats (RocketMQ's ConsumerManager and
ProducerManager).

A consumer group's members are the connections that sent a HEART_BEAT naming the group; the
group keeps the newest subscription each member reported. A member leaves when it says so
(UNREGISTER_CLIENT), when its connection closes (a killed process: at once), or when it sent no
heartbeat for ``channel_expired_s``. Whenever membership changes the remaining members are told
with NOTIFY_CONSUMER_IDS_CHANGED, so they rebalance without waiting for their timer.

A producer group's members are known the same way; for transaction check-backs the broker also
remembers, per group, the connection that last sent one of the group's half messages, and asks
it when no member of the group has sent a heartbeat yet (a stock C++ producer's first heartbeat
can go out before it knows any broker, its next one 30 s later)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from data_plane.remoting.codes import RequestCode
from data_plane.remoting.command import RemotingCommand
from data_plane.remoting.connection import Connection

log = logging.getLogger(__name__)

MAX_GROUPS_PER_CLIENT = 1024
MAX_MEMBERS_PER_GROUP = 10_000


@dataclass
class Member:
    client_id: str
    conn: Connection
    last_update_s: float


@dataclass
class ConsumerGroupInfo:
    group: str
    consume_type: str = "CONSUME_PASSIVELY"
    message_model: str = "CLUSTERING"
    consume_from_where: str = "CONSUME_FROM_LAST_OFFSET"
    members: dict[Connection, Member] = field(default_factory=dict)
    subscriptions: dict[str, dict[str, Any]] = field(default_factory=dict)  # topic → SubscriptionData

    def client_ids(self) -> list[str]:
        return sorted({m.client_id for m in self.members.values()})


class ClientManager:
    def __init__(self, *, channel_expired_s: float = 120.0, clock_s: Callable[[], float] = time.monotonic) -> None:
        self.channel_expired_s = channel_expired_s
        self.clock_s = clock_s
        self.consumer_groups: dict[str, ConsumerGroupInfo] = {}
        self.producer_groups: dict[str, dict[Connection, Member]] = {}
        self.half_senders: dict[str, Connection] = {}  # group → the connection of its last half

    # --- consumers ---------------------------------------------------------------------------
    def register_consumer(self, conn: Connection, client_id: str, data: dict[str, Any]) -> bool:
        """Record a consumer's heartbeat. True when the group's membership or subscriptions
        changed (the caller then notifies the members)."""
        group = str(data.get("groupName") or "")
        info = self.consumer_groups.get(group)
        if info is None:
            info = self.consumer_groups[group] = ConsumerGroupInfo(group)
        info.consume_type = str(data.get("consumeType") or info.consume_type)
        info.message_model = str(data.get("messageModel") or info.message_model)
        info.consume_from_where = str(data.get("consumeFromWhere") or info.consume_from_where)
        now = self.clock_s()
        changed = False
        member = info.members.get(conn)
        if member is None:
            if len(info.members) >= MAX_MEMBERS_PER_GROUP:
                raise ValueError(f"consumer group {group} has {MAX_MEMBERS_PER_GROUP} members already")
            info.members[conn] = Member(client_id, conn, now)
            changed = True
        else:
            member.last_update_s = now
            if member.client_id != client_id:
                member.client_id = client_id
                changed = True
        subs = {}
        for sd in data.get("subscriptionDataSet") or ():
            if isinstance(sd, dict) and sd.get("topic"):
                subs[str(sd["topic"])] = sd
        if subs and subs != info.subscriptions:
            old_topics = set(info.subscriptions)
            info.subscriptions = subs
            changed = changed or set(subs) != old_topics
        return changed

    def unregister_consumer(self, conn: Connection, group: str) -> bool:
        info = self.consumer_groups.get(group)
        if info is None or info.members.pop(conn, None) is None:
            return False
        if not info.members:
            del self.consumer_groups[group]
        return True

    def find_group(self, group: str) -> ConsumerGroupInfo | None:
        return self.consumer_groups.get(group)

    def subscription(self, group: str, topic: str) -> dict[str, Any] | None:
        info = self.consumer_groups.get(group)
        return info.subscriptions.get(topic) if info is not None else None

    # --- producers ---------------------------------------------------------------------------
    def register_producer(self, conn: Connection, client_id: str, group: str) -> None:
        """Raises ValueError when ``conn`` is in MAX_GROUPS_PER_CLIENT producer groups already
        (group names come from the client: without a bound one connection grows the table at will)."""
        members = self.producer_groups.get(group)
        m = members.get(conn) if members is not None else None
        if m is None:
            mine: set[str] = conn.attrs.setdefault("producer_groups", set())
            if len(mine) >= MAX_GROUPS_PER_CLIENT:
                raise ValueError(f"a client may be in at most {MAX_GROUPS_PER_CLIENT} producer groups")
            mine.add(group)
            if members is None:
                members = self.producer_groups[group] = {}
            members[conn] = Member(client_id, conn, self.clock_s())
        else:
            m.last_update_s = self.clock_s()

    def unregister_producer(self, conn: Connection, group: str) -> None:
        members = self.producer_groups.get(group)
        mine = conn.attrs.get("producer_groups")
        if mine is not None:
            mine.discard(group)
        if members is not None:
            members.pop(conn, None)
            if not members:
                del self.producer_groups[group]

    def note_half_sender(self, conn: Connection, group: str) -> None:
        """``conn`` sent a half message of producer group ``group``: the group's check-backs may
        go there while no member of the group has sent a heartbeat. Bounded as heartbeats are
        (at most MAX_GROUPS_PER_CLIENT groups a connection; beyond, not remembered)."""
        previous = self.half_senders.get(group)
        if previous is conn:
            return
        mine: set[str] = conn.attrs.setdefault("half_groups", set())
        if len(mine) >= MAX_GROUPS_PER_CLIENT:
            return
        if previous is not None:
            previous.attrs.get("half_groups", set()).discard(group)
        mine.add(group)
        self.half_senders[group] = conn

    def producer_connection(self, group: str) -> Connection | None:
        """A live connection of the producer group (for transaction check-backs): a member's,
        else the one that last sent a half message of the group."""
        members = self.producer_groups.get(group) or {}
        for conn in members:
            if not conn.closed:
                return conn
        sender = self.half_senders.get(group)
        return sender if sender is not None and not sender.closed else None

    # --- departures --------------------------------------------------------------------------
    def connection_closed(self, conn: Connection) -> list[str]:
        """Forget every registration of ``conn``; the consumer groups that lost a member."""
        changed = []
        for group, info in list(self.consumer_groups.items()):
            if info.members.pop(conn, None) is not None:
                changed.append(group)
                if not info.members:
                    del self.consumer_groups[group]
        for group in list(self.producer_groups):
            self.unregister_producer(conn, group)
        for group in conn.attrs.pop("half_groups", ()):
            if self.half_senders.get(group) is conn:
                del self.half_senders[group]
        return changed

    def expired_connections(self) -> list[Connection]:
        """Connections that sent no heartbeat for ``channel_expired_s``."""
        deadline = self.clock_s() - self.channel_expired_s
        out: set[Connection] = set()
        for info in self.consumer_groups.values():
            out.update(c for c, m in info.members.items() if m.last_update_s < deadline)
        for members in self.producer_groups.values():
            out.update(c for c, m in members.items() if m.last_update_s < deadline)
        return list(out)

    def notify_ids_changed(self, group: str) -> None:
        info = self.consumer_groups.get(group)
        if info is None:
            return
        for conn in info.members:
            if not conn.closed:
                conn.invoke_oneway(
                    RemotingCommand(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, ext_fields={"consumerGroup": group})
                )
