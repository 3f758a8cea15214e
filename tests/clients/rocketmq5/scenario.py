"""One role of a test scenario, played by the official RocketMQ 5 Python client, unmodified
(run in .venv/opt/rocketmq5 by tests/rocketmq5_client.py). Arguments are JSON on stdin; the
result is one JSON line on stdout.

Roles:
  produce     {"endpoint", "ak", "sk", "namespace", "topic", "messages": [{"body", "tag", "keys",
              "props", "group", "delivery_ms"}]}  -> {"sent": [{"message_id", "offset", "recall_handle"}]}
  transaction {..., "topic", "messages": [{"body", "resolution": "commit" | "rollback" | "none"}],
              "check": "commit" | "rollback", "check_wait_s"}   -> {"sent": [...], "checked": [message ids]}
  simple      {..., "group", "topic", "expression", "sql", "count", "invisible_s", "timeout_s",
              "ack": bool, "change_invisible_s": int | null, "await_s"} -> {"received": [...], "errors": [...]}
  push        {..., "group", "topic", "expression", "count", "fail_first": int, "always_fail": [bodies],
              "timeout_s"} -> {"consumed": [...]}
  error       {..., "topic", "call": "send" | "receive", "group"}   -> {"error": "<exception class>: <text>"}
"""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any

from rocketmq import (
    ClientConfiguration,
    ConsumeResult,
    Credentials,
    FilterExpression,
    Message,
    MessageListener,
    Producer,
    PushConsumer,
    SimpleConsumer,
    TransactionChecker,
    TransactionResolution,
)


def config(a: dict[str, Any]) -> ClientConfiguration:
    return ClientConfiguration(a["endpoint"], Credentials(a.get("ak", ""), a.get("sk", "")), a.get("namespace", ""))


def message(topic: str, spec: dict[str, Any]) -> Message:
    m = Message()
    m.topic = topic
    m.body = spec["body"].encode()
    if spec.get("tag"):
        m.tag = spec["tag"]
    if spec.get("keys"):
        m.keys = spec["keys"]
    for k, v in (spec.get("props") or {}).items():
        m.add_property(k, v)
    if spec.get("group"):
        m.message_group = spec["group"]
    if spec.get("delivery_ms"):
        m.delivery_timestamp = spec["delivery_ms"]
    return m


def shown(x: Any) -> dict[str, Any]:
    return {
        "message_id": x.message_id,
        "body": x.body.decode(errors="replace"),
        "tag": x.tag,
        "keys": sorted(x.keys or []),
        "props": dict(x.properties or {}),
        "attempt": x.delivery_attempt,
        "group": x.message_group,
        "corrupted": bool(getattr(x, "corrupted", False)),
        "at": time.time(),
    }


def produce(a: dict[str, Any]) -> dict[str, Any]:
    p = Producer(config(a), (a["topic"],))
    p.startup()
    try:
        sent = []
        for spec in a["messages"]:
            r = p.send(message(a["topic"], spec))
            sent.append({"message_id": r.message_id, "offset": r.offset, "recall_handle": r.recall_handle})
        return {"sent": sent}
    finally:
        p.shutdown()


def transaction(a: dict[str, Any]) -> dict[str, Any]:
    checked: list[str] = []
    verdict = TransactionResolution.COMMIT if a.get("check") == "commit" else TransactionResolution.ROLLBACK

    class Checker(TransactionChecker):
        def check(self, msg: Message) -> TransactionResolution:
            checked.append(msg.message_id)
            return verdict

    p = Producer(config(a), (a["topic"],), Checker())
    p.startup()
    try:
        sent = []
        for spec in a["messages"]:
            tx = p.begin_transaction()
            r = p.send(message(a["topic"], spec), tx)
            sent.append({"message_id": r.message_id, "transaction_id": r.transaction_id})
            if spec["resolution"] == "commit":
                tx.commit()
            elif spec["resolution"] == "rollback":
                tx.rollback()
        deadline = time.time() + float(a.get("check_wait_s", 0))
        want = sum(1 for s in a["messages"] if s["resolution"] == "none")
        while len(set(checked)) < want and time.time() < deadline:
            time.sleep(0.1)
        time.sleep(0.5 if want else 0)  # the check's EndTransaction leaves after the checker returns
        return {"sent": sent, "checked": sorted(set(checked))}
    finally:
        p.shutdown()


def expression(a: dict[str, Any]) -> FilterExpression:
    if a.get("sql"):
        from rocketmq.grpc_protocol import FilterType

        return FilterExpression(a["sql"], FilterType.SQL)
    return FilterExpression(a.get("expression", "*"))


def simple(a: dict[str, Any]) -> dict[str, Any]:
    c = SimpleConsumer(config(a), a["group"], {a["topic"]: expression(a)}, await_duration=a.get("await_s", 2))
    c.startup()
    received: list[dict[str, Any]] = []
    errors: list[str] = []
    try:
        deadline = time.time() + a.get("timeout_s", 20)
        while len(received) < a["count"] and time.time() < deadline:
            try:
                msgs = c.receive(min(32, a["count"] - len(received)), a.get("invisible_s", 15))
            except Exception as e:
                errors.append(f"{type(e).__name__}: {e}")
                time.sleep(0.2)
                continue
            for x in msgs:
                received.append(shown(x))
                if a.get("change_invisible_s") is not None:
                    c.change_invisible_duration(x, a["change_invisible_s"])
                if a.get("ack", True):
                    c.ack(x)
        return {"received": received, "errors": errors}
    finally:
        if a.get("ack", True) or not a.get("crash", False):
            c.shutdown()


def push(a: dict[str, Any]) -> dict[str, Any]:
    consumed: list[dict[str, Any]] = []
    lock = threading.Lock()
    failures: dict[str, int] = {}
    succeeded: set[str] = set()
    done = threading.Event()

    class Listener(MessageListener):
        def consume(self, msg: Message) -> ConsumeResult:
            with lock:
                consumed.append(shown(msg))
                n = failures.get(msg.message_id, 0)
                if n < a.get("fail_first", 0) or msg.body.decode(errors="replace") in a.get("always_fail", ()):
                    failures[msg.message_id] = n + 1
                    return ConsumeResult.FAILURE
                succeeded.add(msg.message_id)
                if len(succeeded) >= a["count"]:
                    done.set()
                return ConsumeResult.SUCCESS

    c = PushConsumer(config(a), a["group"], Listener(), {a["topic"]: expression(a)})
    c.startup()
    try:
        done.wait(a.get("timeout_s", 30))
        time.sleep(0.5)  # the last acknowledgements leave
        return {"consumed": consumed}
    finally:
        c.shutdown()


def error(a: dict[str, Any]) -> dict[str, Any]:
    try:
        if a["call"] == "send":
            produce({"messages": [{"body": "x"}], **a})
        else:
            c = SimpleConsumer(config(a), a["group"], {a["topic"]: FilterExpression()}, await_duration=1)
            c.startup()
            try:
                c.receive(1, 15)
            finally:
                c.shutdown()
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}"}
    return {"error": None}


ROLES = {"produce": produce, "transaction": transaction, "simple": simple, "push": push, "error": error}

if __name__ == "__main__":
    result = ROLES[sys.argv[1]](json.loads(sys.stdin.read()))
    print(json.dumps(result), flush=True)
    sys.stdout.flush()
    import os

    os._exit(0)  # the client's threads (schedulers, the channel loop) would keep the process up
