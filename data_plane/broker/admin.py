"""Administrative and offset requests: topics, subscription groups, consumer offsets, queue
offsets by position and time, messages by id and key, runtime figures."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from collections.abc import Awaitable
from typing import TYPE_CHECKING

from data_plane.auth.request_access import SUBSCRIBE
from data_plane.broker.persisted import SaveBehind
from data_plane.remoting import bodies
from data_plane.remoting.codes import PERM_READ_WRITE, ResponseCode
from data_plane.remoting.command import RemotingCommand
from data_plane.remoting.connection import Connection
from data_plane.remoting.headers import field_bool, field_int, field_str
from data_plane.store.tier import cold_read
from data_plane.store.tier.object_store import ObjectStoreError

if TYPE_CHECKING:
    from data_plane.broker.broker import Broker

log = logging.getLogger(__name__)

_QID = {"lo": 0, "hi": 2**31 - 1}
# A topic's creation is answered once its new queues are made, or after this long.
QUEUES_READY_WAIT_S = 2.0


class AdminProcessor:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.store = broker.store

    # --- topics ------------------------------------------------------------------------------
    def create_topic(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand | Awaitable[RemotingCommand]:
        ext = cmd.ext_fields
        topic = field_str(ext, "topic", max_length=1024)
        hi = self.broker.config.max_topic_queue_nums
        read = field_int(ext, "readQueueNums", self.broker.config.default_topic_queue_nums, lo=1, hi=hi)
        write = field_int(ext, "writeQueueNums", read, lo=1, hi=hi)
        perm = field_int(ext, "perm", PERM_READ_WRITE, lo=0, hi=7)
        order = field_bool(ext, "order", False)
        sys_flag = field_int(ext, "topicSysFlag", 0, lo=0, hi=2**31 - 1)
        before = self.broker.topics.get(topic)
        read_before = before["readQueueNums"] if before is not None else 0
        try:
            self.broker.topics.create_or_update(
                topic, read_queue_nums=read, write_queue_nums=write, perm=perm, order=order, sys_flag=sys_flag,
                behind=True,
            )  # fmt: skip
        except ValueError as e:
            return cmd.response(ResponseCode.SYSTEM_ERROR, str(e))
        if read < read_before:  # queues gone: their held pulls answer now
            self.broker.hold.release_queues(topic, read)
        self.broker.topics_changed()
        return self._created(cmd, self.store.queues_ready(topic))

    async def _created(self, cmd: RemotingCommand, ready: concurrent.futures.Future[None] | None) -> RemotingCommand:
        """The answer once the topic is on disk, and its new queues are made (queue_prepare.py)
        so that sends right after it find them — or after ``QUEUES_READY_WAIT_S`` for those: the
        topic is there either way, and a queue not made yet is made by its first write."""
        if ready is not None and not ready.done():
            await asyncio.wait({asyncio.wrap_future(ready)}, timeout=QUEUES_READY_WAIT_S)
        return await self._when_saved(cmd, self.broker.topics.save_behind)

    async def _when_saved(self, cmd: RemotingCommand, behind: SaveBehind | None) -> RemotingCommand:
        """SUCCESS once the change is on disk (saved off the event loop, persisted.py)."""
        if behind is not None:
            try:
                await behind.saved()
            except OSError as e:
                return cmd.response(ResponseCode.SYSTEM_ERROR, f"saving {behind.what} failed: {e}")
        return cmd.response(ResponseCode.SUCCESS)

    def delete_topic(self, conn: Connection, cmd: RemotingCommand) -> Awaitable[RemotingCommand]:
        topic = field_str(cmd.ext_fields, "topic", max_length=1024)
        if self.broker.topics.delete(topic, behind=True):
            self.broker.offsets.delete_topic(topic)
            self.broker.topics_changed()
        return self._when_saved(cmd, self.broker.topics.save_behind)

    def all_topic_config(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        t = self.broker.topics
        return cmd.response(
            ResponseCode.SUCCESS, body=bodies.dumps({"topicConfigTable": t.topics, "dataVersion": t.data_version})
        )

    # --- subscription groups --------------------------------------------------------------------
    def create_group(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand | Awaitable[RemotingCommand]:
        data = bodies.loads_object(cmd.body_bytes())
        name = data.get("groupName")
        if not isinstance(name, str) or not name or len(name) > 255:
            return cmd.response(ResponseCode.SYSTEM_ERROR, "groupName is missing or too long")
        self.broker.groups.update(name, data, behind=True)
        return self._when_saved(cmd, self.broker.groups.save_behind)

    def all_groups(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        body = {"subscriptionGroupTable": self.broker.groups.groups, "dataVersion": self.broker.topics.data_version}
        return cmd.response(ResponseCode.SUCCESS, body=bodies.dumps(body))

    def delete_group(self, conn: Connection, cmd: RemotingCommand) -> Awaitable[RemotingCommand]:
        self.broker.groups.delete(field_str(cmd.ext_fields, "groupName"), behind=True)
        return self._when_saved(cmd, self.broker.groups.save_behind)

    # --- consumer offsets ---------------------------------------------------------------------
    def query_consumer_offset(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        ext = cmd.ext_fields
        group = field_str(ext, "consumerGroup")
        topic = field_str(ext, "topic")
        queue_id = field_int(ext, "queueId", **_QID)
        offset = self.broker.offsets.query(group, topic, queue_id)
        if offset >= 0:
            return cmd.response(ResponseCode.SUCCESS, ext_fields={"offset": str(offset)})
        # RocketMQ: a group new to a queue whose first message is still there, in memory,
        # starts at 0 (so it sees the whole young queue); otherwise the client decides.
        if self.store.min_offset_in_queue(topic, queue_id) <= 0 and not self.store.unit_in_tier(topic, queue_id, 0):
            phy = self.store.commit_log_offset_in_queue(topic, queue_id, 0)
            if phy < 0 or self.store.max_phy_offset() - phy <= self.store.hot_data_bytes:
                return cmd.response(ResponseCode.SUCCESS, ext_fields={"offset": "0"})
        return cmd.response(ResponseCode.QUERY_NOT_FOUND, "Not found, maybe this group consumer boot first")

    def update_consumer_offset(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        ext = cmd.ext_fields
        group = field_str(ext, "consumerGroup")
        topic = field_str(ext, "topic")
        queue_id = field_int(ext, "queueId", **_QID)
        offset = field_int(ext, "commitOffset", lo=0)
        if self.broker.topics.get(topic) is None:
            return cmd.response(ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist")
        self.broker.offsets.commit(group, topic, queue_id, offset)
        return cmd.response(ResponseCode.SUCCESS)

    # --- queue offsets ------------------------------------------------------------------------
    def max_offset(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        ext = cmd.ext_fields
        off = self.store.max_offset_in_queue(field_str(ext, "topic"), field_int(ext, "queueId", **_QID))
        return cmd.response(ResponseCode.SUCCESS, ext_fields={"offset": str(off)})

    def min_offset(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        ext = cmd.ext_fields
        off = self.store.min_offset_in_queue(field_str(ext, "topic"), field_int(ext, "queueId", **_QID))
        return cmd.response(ResponseCode.SUCCESS, ext_fields={"offset": str(off)})

    def search_offset(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand | Awaitable[RemotingCommand]:
        ext = cmd.ext_fields
        topic = field_str(ext, "topic")
        queue_id = field_int(ext, "queueId", **_QID)
        ts = field_int(ext, "timestamp", lo=0)
        if self.store.tier is not None:  # the search may probe tiered messages
            return self._cold(cmd, self._search_offset_cold(cmd, topic, queue_id, ts))
        off = self.store.offset_in_queue_by_time(topic, queue_id, ts)
        return cmd.response(ResponseCode.SUCCESS, ext_fields={"offset": str(off)})

    async def _search_offset_cold(self, cmd: RemotingCommand, topic: str, queue_id: int, ts: int) -> RemotingCommand:
        off = await self.store.offset_in_queue_by_time_cold(topic, queue_id, ts)
        return cmd.response(ResponseCode.SUCCESS, ext_fields={"offset": str(off)})

    def earliest_msg_store_time(
        self, conn: Connection, cmd: RemotingCommand
    ) -> RemotingCommand | Awaitable[RemotingCommand]:
        ext = cmd.ext_fields
        topic = field_str(ext, "topic")
        queue_id = field_int(ext, "queueId", **_QID)
        first = self.store.min_offset_in_queue(topic, queue_id)
        phy = self.store.commit_log_offset_in_queue(topic, queue_id, first)
        if (phy >= 0 and self.store.cold(phy)) or (phy < 0 and self.store.unit_in_tier(topic, queue_id, first)):
            return self._cold(cmd, self._earliest_cold(cmd, topic, queue_id, first))
        ts = self.store.store_timestamp_at(phy) if phy >= 0 else -1
        return cmd.response(ResponseCode.SUCCESS, ext_fields={"timestamp": str(max(ts, 0))})

    async def _earliest_cold(self, cmd: RemotingCommand, topic: str, queue_id: int, first: int) -> RemotingCommand:
        phy = await self.store.commit_log_offset_in_queue_cold(topic, queue_id, first)
        if phy >= 0 and self.store.cold(phy):
            await self.store.fetch_cold(phy, cold_read.HEADER_SIZE)
        ts = self.store.store_timestamp_at(phy) if phy >= 0 else -1
        return cmd.response(ResponseCode.SUCCESS, ext_fields={"timestamp": str(max(ts, 0))})

    async def _cold(self, cmd: RemotingCommand, answer: Awaitable[RemotingCommand]) -> RemotingCommand:
        """An answer that reads tiered messages; an object store that fails says so."""
        try:
            return await answer
        except ObjectStoreError as e:
            log.warning("a read of tiered messages failed: %s", e)
            return cmd.response(ResponseCode.SYSTEM_ERROR, f"tiered messages cannot be read now: {e}")

    # --- messages -----------------------------------------------------------------------------
    def view_message_by_id(
        self, conn: Connection, cmd: RemotingCommand
    ) -> RemotingCommand | Awaitable[RemotingCommand]:
        offset = field_int(cmd.ext_fields, "offset", lo=0)
        if self.store.cold(offset):
            return self._cold(cmd, self._view_cold(cmd, offset))
        return self._view(cmd, offset, self.store.read_record(offset))

    async def _view_cold(self, cmd: RemotingCommand, offset: int) -> RemotingCommand:
        return self._view(cmd, offset, await self.store.read_record_cold(offset))

    def _view(self, cmd: RemotingCommand, offset: int, rec: bytes | memoryview | None) -> RemotingCommand:
        tenancy = self.broker.tenancy
        if rec is None or (
            tenancy is not None and tenancy.enabled and not tenancy.allows_stored_record(cmd, rec, SUBSCRIBE)
        ):
            return cmd.response(ResponseCode.SYSTEM_ERROR, f"can not find message by the offset, {offset}")
        return cmd.response(ResponseCode.SUCCESS, body=bytes(rec))

    def query_message(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand | Awaitable[RemotingCommand]:
        ext = cmd.ext_fields
        topic = field_str(ext, "topic")
        key = field_str(ext, "key", max_length=4096)
        max_num = min(field_int(ext, "maxNum", 32, lo=1, hi=2**31 - 1), self.broker.config.max_query_messages)
        begin = field_int(ext, "beginTimestamp", 0)
        end = field_int(ext, "endTimestamp", 2**62)
        if self.store.tier is not None:
            return self._cold(cmd, self._query_cold(cmd, topic, key, max_num, begin, end))
        found = self.store.query_message(topic, key, max_num, begin, end)
        return self._query_answer(cmd, [r for m in found if (r := self.store.read_record(m.commit_log_offset))])

    async def _query_cold(
        self, cmd: RemotingCommand, topic: str, key: str, max_num: int, begin: int, end: int
    ) -> RemotingCommand:
        records: list[bytes | memoryview] = []
        for m in await self.store.query_message_cold(topic, key, max_num, begin, end):
            raw = await self.store.read_record_cold(m.commit_log_offset)
            if raw is not None:
                records.append(raw)
        return self._query_answer(cmd, records)

    def _query_answer(self, cmd: RemotingCommand, records: list[bytes | memoryview]) -> RemotingCommand:
        ext_out = {
            "indexLastUpdateTimestamp": str(int(time.time() * 1000)),
            "indexLastUpdatePhyoffset": str(self.store.max_phy_offset()),
        }
        if not records:
            remark = "can not find message, maybe time range not correct"
            return cmd.response(ResponseCode.QUERY_NOT_FOUND, remark, ext_out)
        return cmd.response(ResponseCode.SUCCESS, None, ext_out, body=[bytes(r) for r in records])

    def runtime_info(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.response(ResponseCode.SUCCESS, body=bodies.dumps({"table": self.broker.runtime_info()}))
