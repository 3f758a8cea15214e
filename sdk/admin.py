"""AdminClient: the operator's view of a cluster through its name servers — topics, queues,
messages by id or key, consumer-group progress and offset resets (what RocketMQ's mqadmin does).
The ``orbit`` CLI is built on it.

Every call asks the name servers for the current picture first, so it works against whatever
brokers are registered now."""

from __future__ import annotations

import asyncio
import itertools
import re
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from data_plane.remoting import bodies
from data_plane.remoting.client import RemotingClient
from data_plane.remoting.codes import PERM_READ_WRITE, RequestCode, ResponseCode
from data_plane.remoting.command import RemotingCommand
from data_plane.remoting.errors import RemotingError
from data_plane.store.message import (
    PROPERTY_UNIQ_KEY,
    TRANSACTION_TYPE_MASK,
    StoredMessage,
    decode_message_id,
    decode_record,
    encode_properties,
)
from data_plane.tls import client_context_from_env
from sdk.client_instance import Credentials
from sdk.errors import OrbitError


class AdminError(OrbitError):
    """An admin operation failed; the message says where and why. ``code``: the server's
    response code when a server refused it (NO_PERMISSION 16, …), else None."""

    def __init__(self, message: str = "", *, remark: str = "", addr: str = "", code: int | None = None) -> None:
        super().__init__(message, remark=remark, addr=addr)
        self.code = code

    @property
    def not_permitted(self) -> bool:
        return self.code == ResponseCode.NO_PERMISSION


@dataclass(frozen=True, slots=True)
class QueueProgress:
    broker_name: str
    queue_id: int
    broker_offset: int  # max offset: the next message's offset
    consumer_offset: int  # committed by the group (-1: never)
    min_offset: int

    @property
    def lag(self) -> int:
        start = self.consumer_offset if self.consumer_offset >= 0 else self.min_offset
        return max(0, self.broker_offset - start)


@dataclass(frozen=True, slots=True)
class QueueInfo:
    broker_name: str
    queue_id: int
    min_offset: int
    max_offset: int


def decode_records(body: bytes) -> list[StoredMessage]:
    out = []
    pos = 0
    mv = memoryview(body)
    while pos < len(mv):
        m = decode_record(mv, pos)
        out.append(m)
        pos += m.total_size
    return out


UNIQUE_KEY_QUERY_FLAG = "_UNIQUE_KEY_QUERY"  # QUERY_MESSAGE by a UNIQ_KEY (RocketMQ's MixAll.UNIQUE_MSG_QUERY_FLAG)
_HEX = re.compile(r"[0-9A-Fa-f]+")


def message_id_forms(msg_id: str) -> tuple[bool, bool]:
    """Which message id formats ``msg_id`` has the shape of: ``(offset id, UNIQ_KEY)``. An offset
    message id is 16 bytes (store IPv4 4, port 4, CommitLog offset 8); a producer's UNIQ_KEY is
    16 bytes from an IPv4 client (IP 4, pid 2, per-process 4, time 4, counter 2) or 28 from an
    IPv6 one; both are written as upper-case hex, so a 32-digit id has both shapes."""
    if not _HEX.fullmatch(msg_id):
        return False, False
    return len(msg_id) == 32, len(msg_id) in (32, 56)


def route_addrs(route: dict[str, Any]) -> set[str]:
    """Every broker address (masters and slaves) a topic route lists."""
    return {str(addr) for bd in route.get("brokerDatas", []) for addr in (bd.get("brokerAddrs") or {}).values()}


class AdminClient:
    def __init__(
        self,
        namesrv_addrs: str | Sequence[str],
        *,
        timeout_ms: int = 5000,
        credentials: Credentials | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        """``namesrv_addrs``: a list, or one string of ``;``-separated addresses (as the
        producer and consumers take). ``credentials``: signs every request, to brokers and name
        servers (those of a multi-tenant cluster check them; see sdk.credentials)."""
        if isinstance(namesrv_addrs, str):
            namesrv_addrs = [a.strip() for a in namesrv_addrs.split(";") if a.strip()]
        if not namesrv_addrs:
            raise AdminError("no name server address given")
        self.namesrv_addrs = list(namesrv_addrs)
        self.timeout_ms = timeout_ms
        self.credentials = credentials
        # TLS as the SDK's clients choose it: ``tls``, else ORBIT_TLS_CA / ORBIT_TLS, else plain.
        self.client = RemotingClient(ssl_context=tls if tls is not None else client_context_from_env())
        self._ns = itertools.cycle(self.namesrv_addrs)

    async def close(self) -> None:
        await self.client.close()

    async def __aenter__(self) -> AdminClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- plumbing -----------------------------------------------------------------------------
    async def _sign(self, cmd: RemotingCommand) -> RemotingCommand:
        creds = self.credentials
        if creds is not None:
            fresh = getattr(creds, "ensure_fresh", None)
            pending = fresh() if fresh is not None else None
            if pending is not None:
                await pending
            extra = creds(cmd)
            if extra:
                cmd.ext_fields = {**(cmd.ext_fields or {}), **extra}
        return cmd

    async def _call(self, addr: str, cmd: RemotingCommand) -> RemotingCommand:
        await self._sign(cmd)
        try:
            return await self.client.invoke(addr, cmd, self.timeout_ms)
        except RemotingError as e:
            raise AdminError(str(e), addr=addr) from None

    async def _namesrv(self, cmd_factory: Any) -> RemotingCommand:
        last: Exception | None = None
        for _ in range(len(self.namesrv_addrs)):
            addr = next(self._ns)
            try:
                return await self.client.invoke(addr, await self._sign(cmd_factory()), self.timeout_ms)
            except RemotingError as e:
                last = e
        raise AdminError(f"no name server answered: {last}")

    @staticmethod
    def _ok(r: RemotingCommand, what: str, *codes: int) -> RemotingCommand:
        if r.code not in (ResponseCode.SUCCESS, *codes):
            raise AdminError(f"{what}: code {r.code}: {r.remark or ''}", remark=r.remark or "", code=r.code)
        return r

    # --- cluster ------------------------------------------------------------------------------
    async def cluster_info(self) -> dict[str, Any]:
        r = self._ok(await self._namesrv(lambda: RemotingCommand(RequestCode.GET_BROKER_CLUSTER_INFO)), "cluster info")
        return bodies.loads_object(r.body_bytes())

    async def master_addrs(self, cluster: str | None = None) -> dict[str, str]:
        """broker name → master address (of one cluster, or all)."""
        info = await self.cluster_info()
        names: set[str] | None = None
        if cluster:
            names = set((info.get("clusterAddrTable") or {}).get(cluster) or ())
            if not names:
                raise AdminError(f"no cluster named {cluster!r}")
        out = {}
        for name, bd in (info.get("brokerAddrTable") or {}).items():
            addr = (bd.get("brokerAddrs") or {}).get("0")
            if addr and (names is None or name in names):
                out[name] = addr
        return out

    async def broker_status(self, addr: str) -> dict[str, str]:
        """One broker's runtime figures (GET_BROKER_RUNTIME_INFO): role, offsets, HA lag..."""
        r = self._ok(await self._call(addr, RemotingCommand(RequestCode.GET_BROKER_RUNTIME_INFO)), "runtime info")
        table = bodies.loads_object(r.body_bytes()).get("table") or {}
        return {str(k): str(v) for k, v in table.items()}

    async def cluster_status(self) -> list[dict[str, Any]]:
        """Every registered broker with its runtime figures: ``status`` None where it does not
        answer, ``refused`` the remark where it refuses (these are operators' figures)."""
        info = await self.cluster_info()
        rows: list[dict[str, Any]] = []
        for name, bd in sorted((info.get("brokerAddrTable") or {}).items()):
            for bid, addr in sorted((bd.get("brokerAddrs") or {}).items(), key=lambda kv: int(kv[0])):
                status: dict[str, str] | None = None
                refused: str | None = None
                try:
                    status = await self.broker_status(addr)
                except AdminError as e:
                    if e.not_permitted:
                        refused = e.remark or "not permitted"
                except OrbitError:
                    pass
                rows.append({"broker_name": name, "broker_id": int(bid), "addr": addr, "status": status,
                             "refused": refused})  # fmt: skip
        return rows

    async def route(self, topic: str) -> dict[str, Any]:
        route = await self.route_if_any(topic)
        if route is None:
            raise AdminError(f"topic {topic!r} does not exist")
        return route

    async def route_if_any(self, topic: str) -> dict[str, Any] | None:
        """The topic's route, None when the name servers know no such topic; any other refusal
        (no permission, …) raises AdminError."""
        r = await self._namesrv(
            lambda: RemotingCommand(RequestCode.GET_ROUTEINFO_BY_TOPIC, ext_fields={"topic": topic})
        )
        if r.code == ResponseCode.TOPIC_NOT_EXIST:
            return None
        return bodies.loads_object(self._ok(r, f"route of {topic}").body_bytes())

    @staticmethod
    def _brokers(route: dict[str, Any]) -> dict[str, str]:
        return {
            bd["brokerName"]: bd["brokerAddrs"]["0"]
            for bd in route.get("brokerDatas", [])
            if "0" in (bd.get("brokerAddrs") or {})
        }

    @staticmethod
    def _readers(route: dict[str, Any]) -> dict[str, str]:
        """Broker name → its master's address, or a slave's while the master is away."""
        out = {}
        for bd in route.get("brokerDatas", []):
            addrs = {int(k): str(v) for k, v in (bd.get("brokerAddrs") or {}).items()}
            if addrs:
                out[bd["brokerName"]] = addrs[min(addrs)]
        return out

    def _read_queues(self, route: dict[str, Any]) -> list[tuple[str, str, int]]:
        """(broker name, address, queue id) of every readable queue of a route (the master, or
        a slave while the master is away)."""
        brokers = self._readers(route)
        out: list[tuple[str, str, int]] = []
        for qd in route.get("queueDatas", []):
            addr = brokers.get(qd["brokerName"])
            if addr is not None:
                out.extend((qd["brokerName"], addr, q) for q in range(int(qd["readQueueNums"])))
        return out

    # --- topics -------------------------------------------------------------------------------
    async def create_topic(
        self,
        topic: str,
        *,
        queue_nums: int = 4,
        cluster: str | None = None,
        perm: int = PERM_READ_WRITE,
        order: bool = False,
    ) -> list[str]:
        """Create (or update) ``topic`` on every master of the cluster; their names."""
        masters = await self.master_addrs(cluster)
        if not masters:
            raise AdminError("no broker is registered with the name servers")
        ext = {
            "topic": topic,
            "defaultTopic": "TBW102",
            "readQueueNums": str(queue_nums),
            "writeQueueNums": str(queue_nums),
            "perm": str(perm),
            "topicFilterType": "SINGLE_TAG",
            "topicSysFlag": "0",
            "order": "true" if order else "false",
        }
        for name, addr in masters.items():
            r = await self._call(addr, RemotingCommand(RequestCode.UPDATE_AND_CREATE_TOPIC, ext_fields=dict(ext)))
            self._ok(r, f"create topic on {name}")
        return sorted(masters)

    async def list_topics(self) -> list[str]:
        r = self._ok(
            await self._namesrv(lambda: RemotingCommand(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER)),
            "topic list",
        )
        return sorted(bodies.loads_object(r.body_bytes()).get("topicList") or [])

    async def describe_topic(self, topic: str) -> list[QueueInfo]:
        out = []
        for name, addr, q in self._read_queues(await self.route(topic)):
            lo = await self._queue_offset(addr, RequestCode.GET_MIN_OFFSET, topic, q)
            hi = await self._queue_offset(addr, RequestCode.GET_MAX_OFFSET, topic, q)
            out.append(QueueInfo(name, q, lo, hi))
        return out

    async def _queue_offset(self, addr: str, code: int, topic: str, queue_id: int, **extra: str) -> int:
        ext = {"topic": topic, "queueId": str(queue_id), **extra}
        r = self._ok(await self._call(addr, RemotingCommand(code, ext_fields=ext)), f"offset of {topic}:{queue_id}")
        return int((r.ext_fields or {}).get("offset", "0"))

    # --- messages ------------------------------------------------------------------------------
    async def view_message(self, msg_id: str, topic: str | None = None) -> StoredMessage:
        """A message by its id, in either of two formats that look alike (32 hex digits):

        * an offset message id (store host IPv4 + port + CommitLog offset, what a broker returns
          for a send): read with VIEW_MESSAGE_BY_ID from that store host, but only when the
          name servers list it: a broker of ``topic``'s route, or without a topic any broker
          registered with them (every broker is on the routes of its own system topics).
        * a producer's message id (UNIQ_KEY: client IP, pid, a per-process part, time and a
          counter; 56 digits from an IPv6 client): looked up by ``topic`` in the brokers'
          indexes (``query_by_unique_key``).

        The address an id encodes is never trusted on its own: a UNIQ_KEY decodes to some
        address too (the client's IP and pid), and nothing connects to an address no route
        lists. An offset id is tried first, as RocketMQ's ``viewMessage(topic, msgId)`` does;
        with ``topic`` the unique-key lookup follows when it names no message of the topic.
        Without ``topic`` an id that is not the offset id of a listed broker is an error that
        asks for the topic."""
        offset_id, unique_id = message_id_forms(msg_id)
        if not (offset_id or unique_id):
            raise AdminError(
                f"{msg_id!r} is not a message id: neither an offset message id (32 hex digits) nor a "
                "producer's message id (UNIQ_KEY, 32 or 56 hex digits)"
            )
        route = await self.route(topic) if topic is not None else None
        tried = ""
        if offset_id:
            ip, port, offset = decode_message_id(msg_id)
            addr = f"{ip}:{port}"
            if addr in (route_addrs(route) if route is not None else await self.registered_addrs()):
                m = await self._view_by_offset(addr, offset, msg_id)
                if m is not None and (topic is None or m.topic == topic):
                    return m
                tried = f"{addr} has no message at CommitLog offset {offset}"
        if topic is None:
            where = tried or "it is not the offset message id of a broker the name servers list"
            raise AdminError(
                f"message {msg_id}: {where}; a producer's message id (UNIQ_KEY) is looked up by its "
                "topic: give the topic (orbit message get --topic TOPIC)"
            )
        found = await self.query_by_unique_key(topic, msg_id) if unique_id else None
        if found is None:
            raise AdminError(f"no message of {topic} has the id {msg_id}")
        return found

    async def registered_addrs(self) -> set[str]:
        """The address of every broker (masters and slaves) registered with the name servers."""
        info = await self.cluster_info()
        return {
            str(addr)
            for bd in (info.get("brokerAddrTable") or {}).values()
            for addr in (bd.get("brokerAddrs") or {}).values()
        }

    async def _view_by_offset(self, addr: str, offset: int, msg_id: str) -> StoredMessage | None:
        """The record at CommitLog ``offset`` of the broker at ``addr`` (which the caller found in
        the routes); None when it has none there (or none this client may read: the broker does
        not tell the two apart)."""
        r = await self._call(addr, RemotingCommand(RequestCode.VIEW_MESSAGE_BY_ID, ext_fields={"offset": str(offset)}))
        if r.code == ResponseCode.SYSTEM_ERROR:
            return None
        records = decode_records(self._ok(r, f"message {msg_id}").body_bytes())
        return records[0] if records else None

    async def query_by_unique_key(self, topic: str, unique_key: str) -> StoredMessage | None:
        """The message of ``topic`` whose producer's id (UNIQ_KEY) is ``unique_key``, from the
        index of every broker of the topic's route (QUERY_MESSAGE with ``_UNIQUE_KEY_QUERY``, as
        RocketMQ's ``queryMessageByUniqKey``): the earliest stored when a retried send stored it
        more than once; None when no broker has it. Records whose KEYS merely equal the id do
        not count."""
        best: StoredMessage | None = None
        for addr in self._readers(await self.route(topic)).values():
            ext = {
                "topic": topic,
                "key": unique_key,
                "maxNum": "32",
                "beginTimestamp": "0",
                "endTimestamp": str(2**62),
                UNIQUE_KEY_QUERY_FLAG: "true",
            }
            r = await self._call(addr, RemotingCommand(RequestCode.QUERY_MESSAGE, ext_fields=ext))
            if r.code == ResponseCode.QUERY_NOT_FOUND:
                continue
            for m in decode_records(self._ok(r, f"query {unique_key}").body_bytes()):
                if m.properties.get(PROPERTY_UNIQ_KEY) == unique_key and (
                    best is None or m.store_timestamp < best.store_timestamp
                ):
                    best = m
        return best

    async def query_by_key(self, topic: str, key: str, *, max_num: int = 32) -> list[StoredMessage]:
        route = await self.route(topic)
        found: list[StoredMessage] = []
        for addr in self._brokers(route).values():
            ext = {"topic": topic, "key": key, "maxNum": str(max_num), "beginTimestamp": "0"}
            ext["endTimestamp"] = str(2**62)
            r = await self._call(addr, RemotingCommand(RequestCode.QUERY_MESSAGE, ext_fields=ext))
            if r.code == ResponseCode.QUERY_NOT_FOUND:
                continue
            found.extend(decode_records(self._ok(r, f"query {key}").body_bytes()))
        found.sort(key=lambda m: m.store_timestamp, reverse=True)
        return found[:max_num]

    async def message_trace(self, topic: str, msg_id: str) -> list[dict[str, Any]]:
        """The broker-side trace of a message of ``topic`` (its offset msg id or UNIQ_KEY) from
        every broker of the topic (QUERY_MESSAGE_TRACE, docs/filters_and_trace.md), oldest first."""
        import orjson

        route = await self.route(topic)
        events: list[dict[str, Any]] = []
        for addr in self._brokers(route).values():
            ext = {"topic": topic, "msgId": msg_id}
            r = await self._call(addr, RemotingCommand(RequestCode.QUERY_MESSAGE_TRACE, ext_fields=ext))
            if r.code == ResponseCode.QUERY_NOT_FOUND:
                continue
            doc = orjson.loads(self._ok(r, f"trace {msg_id}").body_bytes())
            events.extend(e for e in doc.get("events", []) if isinstance(e, dict))
        events.sort(key=lambda e: int(e.get("time") or 0))
        return events

    # --- consumer groups ------------------------------------------------------------------------
    async def group_progress(self, group: str, topic: str) -> list[QueueProgress]:
        out = []
        for name, addr, q in self._read_queues(await self.route(topic)):
            hi = await self._queue_offset(addr, RequestCode.GET_MAX_OFFSET, topic, q)
            lo = await self._queue_offset(addr, RequestCode.GET_MIN_OFFSET, topic, q)
            ext = {"consumerGroup": group, "topic": topic, "queueId": str(q)}
            r = await self._call(addr, RemotingCommand(RequestCode.QUERY_CONSUMER_OFFSET, ext_fields=ext))
            committed = int((r.ext_fields or {}).get("offset", "-1")) if r.code == ResponseCode.SUCCESS else -1
            out.append(QueueProgress(name, q, hi, committed, lo))
        return out

    async def reset_offset_to_time(self, group: str, topic: str, timestamp_ms: int) -> dict[tuple[str, int], int]:
        """Set the group's committed offset of every queue to the first message stored at or
        after ``timestamp_ms``. Running consumers of the group keep their in-memory positions:
        stop them first, as with RocketMQ's offline reset."""
        done: dict[tuple[str, int], int] = {}
        for name, addr, q in self._read_queues(await self.route(topic)):
            off = await self._queue_offset(
                addr, RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, topic, q, timestamp=str(timestamp_ms)
            )
            ext = {"consumerGroup": group, "topic": topic, "queueId": str(q), "commitOffset": str(off)}
            r = await self._call(addr, RemotingCommand(RequestCode.UPDATE_CONSUMER_OFFSET, ext_fields=ext))
            self._ok(r, f"reset {topic}:{q}")
            done[(name, q)] = off
        return done

    async def consumer_ids(self, group: str, topic: str) -> list[str]:
        route = await self.route(topic)
        ids: set[str] = set()
        results = await asyncio.gather(
            *(
                self._call(
                    addr, RemotingCommand(RequestCode.GET_CONSUMER_LIST_BY_GROUP, ext_fields={"consumerGroup": group})
                )
                for addr in self._brokers(route).values()
            )
        )
        for r in results:
            if r.code == ResponseCode.SUCCESS:
                ids.update(bodies.loads_object(r.body_bytes()).get("consumerIdList") or [])
        return sorted(ids)

    # --- dead-letter queues (sdk.retry; docs/retries_and_dlq.md) ------------------------------------
    async def dlq_messages(self, group: str, *, max_num: int = 100) -> list[StoredMessage]:
        """Up to ``max_num`` messages of the group's dead-letter queue ``%DLQ%<group>``, oldest
        first (read with PULL_MESSAGE as the group, committing nothing). Empty when the group
        never parked a message."""
        from sdk.retry import dlq_topic

        topic = dlq_topic(group)
        route = await self.route_if_any(topic)
        if route is None:
            return []
        out: list[StoredMessage] = []
        for name, addr, q in self._read_queues(route):
            offset = await self._queue_offset(addr, RequestCode.GET_MIN_OFFSET, topic, q)
            end = await self._queue_offset(addr, RequestCode.GET_MAX_OFFSET, topic, q)
            out.extend(await self._read_queue(group, topic, name, addr, q, offset, end, max_num - len(out)))
        return out

    async def messages_between(
        self, topic: str, group: str, *, begin_ms: int, end_ms: int, max_num: int = 32
    ) -> list[StoredMessage]:
        """Up to ``max_num`` messages of ``topic`` stored from ``begin_ms`` to ``end_ms`` (epoch
        ms, both included), oldest first per queue: each queue's offsets found by time
        (SEARCH_OFFSET_BY_TIMESTAMP), then read with PULL_MESSAGE as ``group`` (a group allowed
        to read the topic), committing nothing."""
        out: list[StoredMessage] = []
        for name, addr, q in self._read_queues(await self.route(topic)):
            if len(out) >= max_num:
                break
            search = RequestCode.SEARCH_OFFSET_BY_TIMESTAMP
            first = await self._queue_offset(addr, search, topic, q, timestamp=str(begin_ms))
            last = await self._queue_offset(addr, search, topic, q, timestamp=str(end_ms + 1))
            got = await self._read_queue(group, topic, name, addr, q, first, last, max_num - len(out))
            out.extend(m for m in got if begin_ms <= m.store_timestamp <= end_ms)
        out.sort(key=lambda m: m.store_timestamp)
        return out

    async def _read_queue(
        self, group: str, topic: str, broker: str, addr: str, queue_id: int, offset: int, end: int, max_num: int
    ) -> list[StoredMessage]:
        """Up to ``max_num`` messages of one queue from ``offset`` to before ``end``, pulled as
        ``group`` without committing."""
        from sdk.message import MessageQueue
        from sdk.protocol import pull_request

        out: list[StoredMessage] = []
        while offset < end and len(out) < max_num:
            cmd = pull_request(
                group=group, mq=MessageQueue(topic, broker, queue_id), offset=offset,
                max_nums=min(32, max_num - len(out)), subscription="*", sub_version=0, suspend_timeout_ms=0,
                suspend=False,
            )  # fmt: skip
            r = await self._call(addr, cmd)
            if r.code != ResponseCode.SUCCESS:
                self._ok(r, f"read {topic}:{queue_id} at {offset}", ResponseCode.PULL_NOT_FOUND,
                         ResponseCode.PULL_RETRY_IMMEDIATELY, ResponseCode.PULL_OFFSET_MOVED)  # fmt: skip
                nxt = int((r.ext_fields or {}).get("nextBeginOffset", offset))
                if nxt <= offset:
                    break
                offset = nxt
                continue
            got = decode_records(r.body_bytes())
            out.extend(got[: max_num - len(out)])
            offset = max(int((r.ext_fields or {}).get("nextBeginOffset", offset + len(got))), offset + 1)
        return out

    async def dlq_message(self, group: str, msg_id: str, *, scan_max: int = 100_000) -> StoredMessage:
        """The dead-lettered message named by ``msg_id``: its producer id (UNIQ_KEY), the parked
        copy's offset id, or its ORIGIN_MESSAGE_ID."""
        from sdk.retry import PROPERTY_ORIGIN_MESSAGE_ID, matches_id

        for m in await self.dlq_messages(group, max_num=scan_max):
            props = m.properties
            if matches_id(
                msg_id,
                unique_id=props.get("UNIQ_KEY"),
                offset_msg_id=m.msg_id,
                origin_msg_id=props.get(PROPERTY_ORIGIN_MESSAGE_ID),
            ):
                return m
        raise AdminError(f"no message {msg_id} in the dead-letter queue of group {group!r}")

    async def resend_dead_letter(self, group: str, m: StoredMessage, *, to_retry_topic: bool = False) -> str:
        """Send a dead-lettered message again, with reconsume times back at 0: to its original
        topic (RETRY_TOPIC; every group subscribed to it gets it), or with ``to_retry_topic`` to
        the group's retry topic (only this group gets it). Returns the new copy's offset id."""
        import random

        from sdk.retry import original_topic, resend_properties, retry_topic

        topic = retry_topic(group) if to_retry_topic else original_topic(m.properties, m.topic)
        route = await self.route(topic)
        brokers = self._brokers(route)
        queues = [
            (brokers[qd["brokerName"]], q)
            for qd in route.get("queueDatas", [])
            if qd["brokerName"] in brokers and int(qd.get("perm", PERM_READ_WRITE)) & 2
            for q in range(int(qd["writeQueueNums"]))
        ]
        if not queues:
            raise AdminError(f"no broker takes writes for topic {topic!r}")
        addr, queue_id = random.choice(queues)
        props = resend_properties(m.properties, dlq_msg_id=m.msg_id)
        ext = {
            "producerGroup": "orbit-dlq-resend",
            "topic": topic,
            "defaultTopic": "TBW102",
            "defaultTopicQueueNums": "4",
            "queueId": str(queue_id),
            "sysFlag": str(m.sys_flag & ~TRANSACTION_TYPE_MASK),
            "bornTimestamp": str(m.born_timestamp),
            "flag": str(m.flag),
            "properties": encode_properties(props).decode(),
            "reconsumeTimes": "0",
        }
        r = await self._call(addr, RemotingCommand(RequestCode.SEND_MESSAGE, ext_fields=ext, body=m.body))
        self._ok(r, f"resend {m.msg_id} to {topic}")
        return (r.ext_fields or {}).get("msgId", "")
