"""TransactionProducer: a message that becomes visible only when a local transaction commits
(RocketMQ's TransactionMQProducer).

::

    def local_transaction(msg: Message, arg: object) -> LocalTransactionState:
        db.insert(arg)                       # the local transaction
        return LocalTransactionState.COMMIT_MESSAGE

    def checker(msg: MessageExt) -> LocalTransactionState:     # the broker asks later
        return COMMIT_MESSAGE if db.has(msg.msg_id) else ROLLBACK_MESSAGE   # or UNKNOW: ask again

    producer = TransactionProducer("orders-tx", checker=checker, namesrv_addrs="127.0.0.1:9876")
    await producer.start()
    r = await producer.send_message_in_transaction(Message("orders", b"..."), local_transaction, order)

The flow (docs/transactions.md):

1. the message goes as a *half message* (properties TRAN_MSG=true, PGROUP=<group>, sys flag
   TRANSACTION_PREPARED_TYPE): stored, invisible to consumers;
2. only when that send succeeded (SEND_OK) ``local_transaction(msg, arg)`` runs (a plain function
   or a coroutine); an exception counts as UNKNOW; a send that was not SEND_OK rolls back without
   running it;
3. END_TRANSACTION (37) tells the broker commit (8), roll back (12) or nothing yet (0);
4. a half left unresolved (UNKNOW, or the END_TRANSACTION lost) is asked about by the broker with
   CHECK_TRANSACTION_STATE (39) on this client's connection; ``checker(msg)`` answers and the
   producer sends END_TRANSACTION with fromTransactionCheck=true. The broker asks after 6 s, then
   every 30 s, 15 times at most, then rolls back. Keep the checker quick or make it a coroutine:
   a plain function runs on the event loop.

Delivery of a committed message is at least once: a half send retried after a timeout can store
two halves (two transactions with one ``msg_id``) if the first attempt landed after all.
"""

from __future__ import annotations

import asyncio
import enum
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Unpack

from data_plane.remoting.codes import SYS_FLAG_TRANSACTION_PREPARED, RequestCode, ResponseCode
from data_plane.remoting.command import RemotingCommand
from data_plane.store.message import decode_message_id, encode_properties
from sdk import protocol
from sdk.errors import ClientStateError, IllegalArgumentError, OrbitError
from sdk.message import Message, MessageExt, MessageQueue, SendResult, SendStatus, new_unique_id
from sdk.producer import Producer, ProducerOptions

log = logging.getLogger(__name__)

PROPERTY_TRANSACTION_PREPARED = "TRAN_MSG"
PROPERTY_PRODUCER_GROUP = "PGROUP"
PROPERTY_UNIQ_KEY = "UNIQ_KEY"
# END_TRANSACTION's commitOrRollback (MessageSysFlag).
TRANSACTION_NOT_TYPE = 0
TRANSACTION_COMMIT_TYPE = 0x8
TRANSACTION_ROLLBACK_TYPE = 0xC


class LocalTransactionState(enum.Enum):
    """What the local transaction (or the checker) says; RocketMQ's names, UNKNOW included."""

    COMMIT_MESSAGE = "COMMIT_MESSAGE"
    ROLLBACK_MESSAGE = "ROLLBACK_MESSAGE"
    UNKNOW = "UNKNOW"


_END_TYPE = {
    LocalTransactionState.COMMIT_MESSAGE: TRANSACTION_COMMIT_TYPE,
    LocalTransactionState.ROLLBACK_MESSAGE: TRANSACTION_ROLLBACK_TYPE,
    LocalTransactionState.UNKNOW: TRANSACTION_NOT_TYPE,
}

StateOrAwaitable = LocalTransactionState | Awaitable[LocalTransactionState]
LocalTransaction = Callable[[Message, Any], StateOrAwaitable]
TransactionChecker = Callable[[MessageExt], StateOrAwaitable]


@dataclass(frozen=True, slots=True)
class TransactionSendResult:
    """The half message's send result, what the local transaction said, and whether the broker
    took the END_TRANSACTION (``end_error`` says why not; the broker's check then decides)."""

    send_result: SendResult
    local_state: LocalTransactionState
    transaction_id: str
    end_error: str | None = None


def end_transaction_request(
    *,
    group: str,
    state: LocalTransactionState,
    commit_log_offset: int,
    table_offset: int,
    msg_id: str,
    transaction_id: str,
    from_check: bool,
) -> RemotingCommand:
    """END_TRANSACTION (37): EndTransactionRequestHeader."""
    ext = {
        "producerGroup": group,
        "tranStateTableOffset": str(table_offset),
        "commitLogOffset": str(commit_log_offset),
        "commitOrRollback": str(_END_TYPE[state]),
        "fromTransactionCheck": "true" if from_check else "false",
        "msgId": msg_id,
        "transactionId": transaction_id,
    }
    return RemotingCommand(RequestCode.END_TRANSACTION, ext_fields=ext)


def half_send_request(*, group: str, msg: Message, queue_id: int, unique_id: str) -> RemotingCommand:
    """SEND_MESSAGE_V2 of a half message: TRAN_MSG and PGROUP set, sys flag PREPARED."""
    cmd = protocol.send_request(
        group=group, msg=msg, queue_id=queue_id, unique_id=unique_id, born_timestamp_ms=int(time.time() * 1000)
    )
    props = msg.wire_properties(unique_id)
    props[PROPERTY_TRANSACTION_PREPARED] = "true"
    props[PROPERTY_PRODUCER_GROUP] = group
    assert cmd.ext_fields is not None
    cmd.ext_fields["i"] = encode_properties(props).decode()
    cmd.ext_fields["f"] = str(SYS_FLAG_TRANSACTION_PREPARED)
    return cmd


async def _resolve(value: StateOrAwaitable) -> LocalTransactionState:
    state = await value if inspect.isawaitable(value) else value
    if not isinstance(state, LocalTransactionState):
        raise TypeError(f"expected a LocalTransactionState, got {state!r}")
    return state


class TransactionProducer(Producer):
    """A ``Producer`` that also sends transactional messages; ``checker`` answers the broker's
    checks of this group's unresolved transactions (any instance of the group may be asked)."""

    def __init__(self, group: str, *, checker: TransactionChecker, **options: Unpack[ProducerOptions]) -> None:
        if not callable(checker):
            raise IllegalArgumentError("checker must be callable")
        super().__init__(group, **options)
        self.checker = checker
        self._checks: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> TransactionProducer:
        await self.start()
        return self

    async def shutdown(self) -> None:
        for t in list(self._checks):
            t.cancel()
        await super().shutdown()

    async def send_message_in_transaction(
        self, msg: Message, local_transaction: LocalTransaction, arg: Any = None
    ) -> TransactionSendResult:
        """Send ``msg`` as a half message, run ``local_transaction(msg, arg)``, end the
        transaction accordingly. Send failures raise (nothing is stored then, or an orphan half
        the checker resolves); the local transaction's exception counts as UNKNOW."""
        self._check_message(msg)
        uid = new_unique_id()

        def build(mq: MessageQueue) -> RemotingCommand:
            return half_send_request(group=self.group, msg=msg, queue_id=mq.queue_id, unique_id=uid)

        result = await self._send(msg.topic, msg, build, uid, None, None)
        if result.status is not SendStatus.SEND_OK:
            state = LocalTransactionState.ROLLBACK_MESSAGE  # RocketMQ: not durable as asked → roll back
        else:
            try:
                state = await _resolve(local_transaction(msg, arg))
            except Exception:
                log.exception("local transaction of %s failed; its state is UNKNOW (the broker will check)", uid)
                state = LocalTransactionState.UNKNOW
        end_error = await self._end(result, state, uid)
        return TransactionSendResult(result, state, uid, end_error)

    async def _end(self, result: SendResult, state: LocalTransactionState, uid: str) -> str | None:
        inst = self.instance
        addr = inst.find_broker_addr(result.message_queue.broker_name)
        if addr is None:
            return f"no address for broker {result.message_queue.broker_name}"
        try:
            _ip, _port, log_offset = decode_message_id(result.offset_msg_id)
        except ValueError as e:
            return f"the send result's offset message id is malformed: {e}"
        cmd = end_transaction_request(
            group=self.group,
            state=state,
            commit_log_offset=log_offset,
            table_offset=result.queue_offset,
            msg_id=uid,
            transaction_id=uid,
            from_check=False,
        )
        try:
            resp = await inst.invoke(addr, cmd, self.send_timeout_ms)
        except OrbitError as e:
            log.warning("END_TRANSACTION of %s to %s failed (%s); the broker will check", uid, addr, e)
            return str(e)
        if resp.code != ResponseCode.SUCCESS:
            log.warning("END_TRANSACTION of %s refused by %s: %s %s", uid, addr, resp.code, resp.remark)
            return f"code {resp.code}: {resp.remark}"
        return None

    # --- the broker's checks (ClientInstance dispatches CHECK_TRANSACTION_STATE here) -------------
    def check_transaction_state(self, addr: str, msg: MessageExt, header: Mapping[str, str]) -> None:
        task = asyncio.ensure_future(self._answer_check(addr, msg, dict(header)))
        self._checks.add(task)
        task.add_done_callback(self._checks.discard)

    async def _answer_check(self, addr: str, msg: MessageExt, header: dict[str, str]) -> None:
        try:
            state = await _resolve(self.checker(msg))
        except Exception:
            log.exception("transaction checker failed for %s; answering UNKNOW", msg.msg_id)
            state = LocalTransactionState.UNKNOW
        try:
            cmd = end_transaction_request(
                group=self.group,
                state=state,
                commit_log_offset=int(header.get("commitLogOffset", "-1")),
                table_offset=int(header.get("tranStateTableOffset", "-1")),
                msg_id=msg.properties.get(PROPERTY_UNIQ_KEY) or msg.offset_msg_id,
                transaction_id=header.get("transactionId") or msg.msg_id,
                from_check=True,
            )
        except ValueError:
            log.warning("CHECK_TRANSACTION_STATE from %s has malformed offsets: %s", addr, header)
            return
        try:
            await self.instance.invoke_oneway(addr, cmd)  # RocketMQ answers a check oneway
        except (OrbitError, ClientStateError) as e:
            log.info("answering a transaction check to %s failed: %s", addr, e)
