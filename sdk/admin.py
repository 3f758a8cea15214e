"""AdminClient: the operator's view of a cluster through its name servers — topics, queues,
messages by id or key, consumer-group progress and offset resets (what RocketMQ's mqadmin does).
The ``orbit`` CLI is built on it.

Every call asks the name servers for the current picture first, so it works against whatever
brokers are registered now."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from data_plane.remoting import bodies
from data_plane.remoting.client import RemotingClient
from data_plane.remoting.codes import PERM_READ_WRITE, RequestCode, ResponseCode
from data_plane.remoting.command import RemotingCommand
from data_plane.remoting.errors import RemotingError
from data_plane.store.message import StoredMessage, decode_message_id, decode_record
from sdk.client_instance import Credentials
from sdk.errors import OrbitError


class AdminError(OrbitError):
    """An admin operation failed; the message says where and why."""


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


class AdminClient:
    def __init__(
        self, namesrv_addrs: Sequence[str], *, timeout_ms: int = 5000, credentials: Credentials | None = None
    ) -> None:
        """``credentials``: signs every request to a broker (see sdk.credentials); name server
        requests go unsigned, as RocketMQ's do."""
        if not namesrv_addrs:
            raise AdminError("no name server address given")
        self.namesrv_addrs = list(namesrv_addrs)
        self.timeout_ms = timeout_ms
        self.credentials = credentials
        self.client = RemotingClient()
        self._ns = itertools.cycle(self.namesrv_addrs)

    async def close(self) -> None:
        await self.client.close()

    async def __aenter__(self) -> AdminClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- plumbing -----------------------------------------------------------------------------
    async def _call(self, addr: str, cmd: RemotingCommand) -> RemotingCommand:
        creds = self.credentials
        if creds is not None:
            fresh = getattr(creds, "ensure_fresh", None)
            pending = fresh() if fresh is not None else None
            if pending is not None:
                await pending
            extra = creds(cmd)
            if extra:
                cmd.ext_fields = {**(cmd.ext_fields or {}), **extra}
        try:
            return await self.client.invoke(addr, cmd, self.timeout_ms)
        except RemotingError as e:
            raise AdminError(str(e), addr=addr) from None

    async def _namesrv(self, cmd_factory: Any) -> RemotingCommand:
        last: Exception | None = None
        for _ in range(len(self.namesrv_addrs)):
            addr = next(self._ns)
            try:
                return await self.client.invoke(addr, cmd_factory(), self.timeout_ms)
            except RemotingError as e:
                last = e
        raise AdminError(f"no name server answered: {last}")

    @staticmethod
    def _ok(r: RemotingCommand, what: str, *codes: int) -> RemotingCommand:
        if r.code not in (ResponseCode.SUCCESS, *codes):
            raise AdminError(f"{what}: code {r.code}: {r.remark or ''}")
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

    async def route(self, topic: str) -> dict[str, Any]:
        r = await self._namesrv(
            lambda: RemotingCommand(RequestCode.GET_ROUTEINFO_BY_TOPIC, ext_fields={"topic": topic})
        )
        if r.code == ResponseCode.TOPIC_NOT_EXIST:
            raise AdminError(f"topic {topic!r} does not exist")
        return bodies.loads_object(self._ok(r, f"route of {topic}").body_bytes())

    @staticmethod
    def _brokers(route: dict[str, Any]) -> dict[str, str]:
        return {
            bd["brokerName"]: bd["brokerAddrs"]["0"]
            for bd in route.get("brokerDatas", [])
            if "0" in (bd.get("brokerAddrs") or {})
        }

    def _read_queues(self, route: dict[str, Any]) -> list[tuple[str, str, int]]:
        """(broker name, master address, queue id) of every readable queue of a route."""
        brokers = self._brokers(route)
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
    async def view_message(self, msg_id: str) -> StoredMessage:
        """A message by its id (the store host and CommitLog offset it encodes)."""
        try:
            ip, port, offset = decode_message_id(msg_id)
        except ValueError as e:
            raise AdminError(f"{msg_id!r} is not a message id: {e}") from None
        r = await self._call(
            f"{ip}:{port}", RemotingCommand(RequestCode.VIEW_MESSAGE_BY_ID, ext_fields={"offset": str(offset)})
        )
        self._ok(r, f"message {msg_id}")
        return decode_records(r.body_bytes())[0]

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
