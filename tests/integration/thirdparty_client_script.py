"""Drive the third-party RocketMQ client (PyPI ``rocketmq-python-cvs``: the Apache
rocketmq-client-python 2.0 API over the official C++ client) against a name server, one role per
process. Run by tests/integration/test_thirdparty_client.py as a subprocess, since a fault in the
C++ client ends in a segfault or a hang rather than an exception; results go to stdout as one
JSON document.

``produce NS TOPIC GROUP``  messages as a JSON list on stdin: ``{"body", "tags", "keys", "props",
                            "delay_level"}``;
                            prints ``{"results": [{"status", "msg_id", "offset"}, ...],
                            "first_send_failures": n}`` (how often the first send failed and was tried again).
``push NS TOPIC GROUP``     a push consumer until ``--expect`` messages arrived and then ``--idle-s``
                            passed without another (or ``--timeout-s``);
                            prints ``{"messages": [...], "timed_out": bool}``.
``pull NS TOPIC GROUP``     one ``PullConsumer.pull`` pass over every queue; prints ``{"messages": [...]}``.
``transaction NS TOPIC GROUP`` the C++ client's TransactionMQProducer (``CreateTransactionProducer`` /
                            ``SendMessageTransaction``, declared here: the binding does not wrap them);
                            messages on stdin: ``{"body", "decision"}`` with decision commit, rollback,
                            unknown-commit or unknown-rollback (the local transaction answers UNKNOW and
                            the checker decides); waits until every unknown one was checked (or
                            ``--timeout-s``); prints ``{"results": [...], "checked": [body, ...], "timed_out"}``.

``push --reconsume-later N`` answers "consume later" (the binding's ``_CConsumeStatus.RECONSUME_LATER``)
to a message while its reconsume times are under N, so the client sends it back to the broker's
retry topic; ``--expect`` then counts the deliveries answered with success. (The C API stops at
the first message of a batch that is consumed later and gives the whole batch back: the others
go back unseen.)

``--access-key AK --secret-key SK`` sign every request as RocketMQ's ACL does
(``set_session_credentials``); ``--allow-failures`` makes ``produce`` record a failed send in
``"failures"`` (its error text) and go on, instead of exiting.

Messages are ``{"id", "topic", "body_b64", "tags", "keys", "props", "queue_id", "queue_offset",
"reconsume_times"}``, ``props`` holding the ``--prop`` names asked for. Every document also
names the ``library`` directory the client was imported from.
"""

from __future__ import annotations

import argparse
import base64
import ctypes
import json
import os
import sys
import threading
import time
from typing import Any

import rocketmq.client
from rocketmq.client import Message, Producer, PullConsumer, PushConsumer
from rocketmq.exceptions import ProducerSendSyncFailed
from rocketmq.ffi import dll


def _text(v: Any) -> str | None:
    if v is None:
        return None
    return v.decode() if isinstance(v, bytes) else str(v)


def _record(msg: Any, props: list[str]) -> dict[str, Any]:
    """Every field read while the C++ message is alive (inside the callback / pull loop)."""
    return {
        "id": msg.id,
        "topic": msg.topic,
        "body_b64": base64.b64encode(msg.body).decode(),
        "tags": _text(msg.tags),
        "keys": _text(msg.keys),
        "props": {p: _text(msg.get_property(p)) for p in props},
        "queue_id": int(msg.queue_id),
        "queue_offset": int(msg.queue_offset),
        "reconsume_times": int(msg.reconsume_times),
    }


def _log_to(client: Any, log_dir: str) -> None:
    """rocketmq-python-cvs has ``set_log_root_path``; older bindings log under $HOME/logs."""
    if hasattr(client, "set_log_root_path"):
        client.set_log_root_path(log_dir)


def _credentials(client: Any, args: argparse.Namespace) -> None:
    if args.access_key:
        client.set_session_credentials(args.access_key, args.secret_key, "")


def produce(args: argparse.Namespace) -> dict[str, Any]:
    specs: list[dict[str, Any]] = json.load(sys.stdin)
    producer = Producer(args.group)
    producer.set_namesrv_addr(args.namesrv)
    _log_to(producer, args.log_dir)
    _credentials(producer, args)
    producer.start()
    results = []
    failures: list[str] = []
    first_send_failures = 0
    try:
        for i, spec in enumerate(specs):
            m = Message(args.topic)
            if spec.get("keys"):
                m.set_keys(spec["keys"])
            if spec.get("tags"):
                m.set_tags(spec["tags"])
            for k, v in (spec.get("props") or {}).items():
                m.set_property(k, v)
            if spec.get("delay_level"):
                m.set_delay_time_level(int(spec["delay_level"]))  # the client's own DELAY setter
            m.set_body(spec["body"])
            while True:
                try:
                    r = producer.send_sync(m)
                    break
                except ProducerSendSyncFailed as e:
                    if args.allow_failures:
                        failures.append(str(e))
                        r = None
                        break
                    # C++ client 1.0.1 (rocketmq 0.4.4) sends the first message while its connection
                    # to the broker may still be opening; on a busy machine that send fails at once,
                    # and its retries skip the only broker ("could not find property mq"). Only the
                    # first send, which opens the connection, gets more tries.
                    first_send_failures += 1
                    if i > 0 or first_send_failures >= 3:
                        raise
                    time.sleep(0.2)
            if r is not None:
                results.append({"status": int(r.status), "msg_id": r.msg_id, "offset": int(r.offset)})
    finally:
        producer.shutdown()
    out: dict[str, Any] = {"results": results, "first_send_failures": first_send_failures}
    if args.allow_failures:
        out["failures"] = failures
    return out


def push(args: argparse.Namespace) -> dict[str, Any]:
    got: list[dict[str, Any]] = []
    lock = threading.Lock()
    last_at = [time.monotonic()]
    succeeded = [0]

    def on_message(msg: Any) -> dict[str, Any]:
        rec = _record(msg, args.prop)
        with lock:
            got.append(rec)
            last_at[0] = time.monotonic()
        return rec

    def on_message_or_later(_consumer: Any, raw: Any) -> int:
        # The binding's subscribe() cannot answer "consume later" (an exception in its callback
        # is not a status), so this callback is registered directly and returns the status.
        from rocketmq.ffi import _CConsumeStatus

        later = on_message(rocketmq.client.RecvMessage(raw))["reconsume_times"] < args.reconsume_later
        if not later:
            with lock:
                succeeded[0] += 1
        return int((_CConsumeStatus.RECONSUME_LATER if later else _CConsumeStatus.CONSUME_SUCCESS).value)

    consumer = PushConsumer(args.group)
    consumer.set_namesrv_addr(args.namesrv)
    _log_to(consumer, args.log_dir)
    _credentials(consumer, args)
    if hasattr(dll, "SetPushConsumerMessageTrace"):
        # rocketmq-python-cvs: shutdown() segfaults unless message trace is switched on (0 = on);
        # the binding does not declare the function, so its argument types must be declared here.
        dll.SetPushConsumerMessageTrace.argtypes = [ctypes.c_void_p, ctypes.c_int]
        dll.SetPushConsumerMessageTrace(consumer._handle, 0)
    if args.reconsume_later:
        from rocketmq.exceptions import ffi_check

        ffi_check(dll.Subscribe(consumer._handle, args.topic.encode(), args.expression.encode()))
        consumer._register_callback(on_message_or_later)
    else:
        consumer.subscribe(args.topic, on_message, expression=args.expression)
    consumer.start()
    deadline = time.monotonic() + args.timeout_s
    timed_out = True
    try:
        while time.monotonic() < deadline:
            with lock:
                n = succeeded[0] if args.reconsume_later else len(got)
                done = n >= args.expect and time.monotonic() - last_at[0] >= args.idle_s
            if done:
                timed_out = False
                break
            time.sleep(0.02)
    finally:
        consumer.shutdown()
    with lock:
        return {"messages": list(got), "timed_out": timed_out}


def pull(args: argparse.Namespace) -> dict[str, Any]:
    consumer = PullConsumer(args.group)
    consumer.set_namesrv_addr(args.namesrv)
    _log_to(consumer, args.log_dir)
    _credentials(consumer, args)
    consumer.start()
    try:
        messages = [_record(m, args.prop) for m in consumer.pull(args.topic, expression=args.expression, max_num=32)]
    finally:
        consumer.shutdown()
    return {"messages": messages}


# CTransactionStatus of the C API (CProducer.h).
_TX_COMMIT, _TX_ROLLBACK, _TX_UNKNOWN = 0, 1, 2
_TX_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)


def transaction(args: argparse.Namespace) -> dict[str, Any]:
    from rocketmq.ffi import _CSendResult

    specs: list[dict[str, Any]] = json.load(sys.stdin)
    decisions = {s["body"]: s["decision"] for s in specs}
    checked: list[str] = []
    lock = threading.Lock()

    def final(body: str) -> int:
        return _TX_COMMIT if decisions.get(body, "").endswith("commit") else _TX_ROLLBACK

    def on_check(_producer: Any, msg_ext: Any, _data: Any) -> int:
        body = (dll.GetMessageBody(msg_ext) or b"").decode()
        with lock:
            checked.append(body)
        return final(body)

    def on_execute(_producer: Any, msg: Any, _data: Any) -> int:
        body = (dll.GetOriginMessageBody(msg) or b"").decode()
        return _TX_UNKNOWN if decisions.get(body, "").startswith("unknown") else final(body)

    check_cb, execute_cb = _TX_CALLBACK(on_check), _TX_CALLBACK(on_execute)  # kept alive until exit
    dll.CreateTransactionProducer.argtypes = [ctypes.c_char_p, _TX_CALLBACK, ctypes.c_void_p]
    dll.CreateTransactionProducer.restype = ctypes.c_void_p
    dll.SendMessageTransaction.argtypes = [
        ctypes.c_void_p, ctypes.c_void_p, _TX_CALLBACK, ctypes.c_void_p, ctypes.POINTER(_CSendResult),
    ]  # fmt: skip
    dll.SendMessageTransaction.restype = ctypes.c_int
    dll.GetOriginMessageBody.argtypes = [ctypes.c_void_p]
    dll.GetOriginMessageBody.restype = ctypes.c_char_p
    handle = dll.CreateTransactionProducer(args.group.encode(), check_cb, None)
    dll.SetProducerNameServerAddress(handle, args.namesrv.encode())
    if hasattr(dll, "SetProducerLogPath"):
        dll.SetProducerLogPath.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        dll.SetProducerLogPath(handle, args.log_dir.encode())
    if dll.StartProducer(handle) != 0:
        raise SystemExit("StartProducer failed")
    results = []
    for spec in specs:
        m = Message(args.topic)
        m.set_body(spec["body"])
        r = _CSendResult()
        for attempt in range(3):  # the first send may race the connection's opening (see produce)
            rc = dll.SendMessageTransaction(handle, m._handle, execute_cb, None, ctypes.pointer(r))
            if rc == 0:
                break
            time.sleep(0.2 * (attempt + 1))
        results.append({"rc": rc, "status": int(r.sendStatus), "msg_id": r.msgId.decode(), "offset": int(r.offset)})
    unknown = {s["body"] for s in specs if s["decision"].startswith("unknown")}
    deadline = time.monotonic() + args.timeout_s
    timed_out = True
    while time.monotonic() < deadline:
        with lock:
            if unknown <= set(checked):
                timed_out = False
                break
        time.sleep(0.05)
    time.sleep(args.idle_s)  # let the answers to the last checks go out
    dll.ShutdownProducer(handle)
    with lock:
        return {"results": results, "checked": list(checked), "timed_out": timed_out}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("role", choices=["produce", "push", "pull", "transaction"])
    ap.add_argument("namesrv")
    ap.add_argument("topic")
    ap.add_argument("group")
    ap.add_argument("--log-dir", required=True)
    ap.add_argument("--expression", default="*")
    ap.add_argument("--prop", action="append", default=[], help="a user property to read back")
    ap.add_argument("--expect", type=int, default=0)
    ap.add_argument("--idle-s", type=float, default=0.0)
    ap.add_argument("--timeout-s", type=float, default=30.0)
    ap.add_argument("--access-key", default="", help="sign requests with this access key (RocketMQ ACL)")
    ap.add_argument("--secret-key", default="")
    ap.add_argument("--reconsume-later", type=int, default=0, help="push: consume later the first N deliveries")
    ap.add_argument("--allow-failures", action="store_true", help="produce: record failed sends and go on")
    args = ap.parse_args()
    out = {"produce": produce, "push": push, "pull": pull, "transaction": transaction}[args.role](args)
    out["library"] = os.path.dirname(rocketmq.client.__file__)
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()
    # Skip the binding's __del__ finalizers (a second shutdown and destroy in the C++ client):
    # everything there is to say has been said.
    os._exit(0)


if __name__ == "__main__":
    main()
