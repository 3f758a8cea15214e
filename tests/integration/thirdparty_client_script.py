"""Drive the third-party RocketMQ client (PyPI ``rocketmq-python-cvs``: the Apache
rocketmq-client-python 2.0 API over the official C++ client) against a name server, one role per
process. Run by tests/integration/test_thirdparty_client.py as a subprocess, since a fault in the
C++ client ends in a segfault or a hang rather than an exception; results go to stdout as one
JSON document.

``produce NS TOPIC GROUP``  messages as a JSON list on stdin: ``{"body", "tags", "keys", "props"}``;
                            prints ``{"results": [{"status", "msg_id", "offset"}, ...],
                            "first_send_failures": n}`` (how often the first send failed and was tried again).
``push NS TOPIC GROUP``     a push consumer until ``--expect`` messages arrived and then ``--idle-s``
                            passed without another (or ``--timeout-s``);
                            prints ``{"messages": [...], "timed_out": bool}``.
``pull NS TOPIC GROUP``     one ``PullConsumer.pull`` pass over every queue; prints ``{"messages": [...]}``.

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

    def on_message(msg: Any) -> None:
        rec = _record(msg, args.prop)
        with lock:
            got.append(rec)
            last_at[0] = time.monotonic()

    consumer = PushConsumer(args.group)
    consumer.set_namesrv_addr(args.namesrv)
    _log_to(consumer, args.log_dir)
    _credentials(consumer, args)
    if hasattr(dll, "SetPushConsumerMessageTrace"):
        # rocketmq-python-cvs: shutdown() segfaults unless message trace is switched on (0 = on);
        # the binding does not declare the function, so its argument types must be declared here.
        dll.SetPushConsumerMessageTrace.argtypes = [ctypes.c_void_p, ctypes.c_int]
        dll.SetPushConsumerMessageTrace(consumer._handle, 0)
    consumer.subscribe(args.topic, on_message, expression=args.expression)
    consumer.start()
    deadline = time.monotonic() + args.timeout_s
    timed_out = True
    try:
        while time.monotonic() < deadline:
            with lock:
                done = len(got) >= args.expect and time.monotonic() - last_at[0] >= args.idle_s
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("role", choices=["produce", "push", "pull"])
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
    ap.add_argument("--allow-failures", action="store_true", help="produce: record failed sends and go on")
    args = ap.parse_args()
    out = {"produce": produce, "push": push, "pull": pull}[args.role](args)
    out["library"] = os.path.dirname(rocketmq.client.__file__)
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()
    # Skip the binding's __del__ finalizers (a second shutdown and destroy in the C++ client):
    # everything there is to say has been said.
    os._exit(0)


if __name__ == "__main__":
    main()
