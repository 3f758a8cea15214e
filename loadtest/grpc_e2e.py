"""``orbit bench e2e``'s gRPC phases: the broker's RocketMQ 5 endpoint measured beside the
remoting phases, on the same cluster and machine.

1. ``grpc_batched``: SendMessage calls of 32 messages, 8 in flight in each of 2 processes;
2. ``grpc_unary_16``: 16 senders of one message a call, awaiting each answer (2 processes);
3. ``grpc_receive_ack``: ReceiveMessage (32 a call) then one AckMessage for what it got, until
   the messages phase 1 stored are consumed (2 processes, 4 receivers each);
4. ``grpc_half_peak``: one open-loop sender at half of phase 2's rate; send latency.

The load comes from the compiled v2 messages over Orbit's own gRPC client
(``data_plane.http2.grpc_client``, one HTTP/2 connection a process): grpcio's client, and the
official clients on it, spend more CPU a call than the endpoint and would measure themselves.
Every process measures after a warm-up; latencies go to HDR histograms.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import time
import uuid
from collections.abc import Callable
from typing import Any

from data_plane.http2.grpc_client import GrpcChannel
from data_plane.http2.grpc_server import CallError
from data_plane.proxy.answers import varint
from loadtest.histogram import encode_hist, hist_of, latency_log, merge, summary_ms

BATCH = 32


_ID_HOLDER = b"#" * 32


class Requests:
    """Serialized SendMessageRequests of ``n`` messages each, every message with a new id (a
    process-random 16-hex-digit prefix and a counter, 32 characters as a UUID's hex): the
    message is serialized once with a stand-in id, then only the id bytes change, so that the
    load generator's CPU goes to the calls rather than to building them."""

    def __init__(self, topic: str, body: bytes, n: int) -> None:
        from data_plane.proxy.v2 import definition_pb2 as pb

        m = pb.Message(topic=pb.Resource(name=topic), body=body)
        sp = m.system_properties
        sp.message_id = _ID_HOLDER.decode()
        sp.message_type = pb.NORMAL
        sp.body_encoding = pb.IDENTITY
        sp.tag = "bench"
        raw = m.SerializeToString()
        at = raw.index(_ID_HOLDER)
        size = len(raw)
        head = b"\x0a" + varint(size)  # SendMessageRequest.messages = 1, length-delimited
        self.before = head + raw[:at]
        self.after = raw[at + len(_ID_HOLDER) :]
        self.n = n
        self.prefix = uuid.uuid4().hex[:16].upper()
        self.count = 0

    def next(self) -> bytes:
        parts: list[bytes] = []
        before, after, prefix = self.before, self.after, self.prefix
        for i in range(self.count, self.count + self.n):
            parts += (before, f"{prefix}{i:016X}".encode(), after)
        self.count += self.n
        return b"".join(parts)


async def _channel(endpoint: str) -> GrpcChannel:
    host, _, port = endpoint.rpartition(":")
    return await GrpcChannel.connect(host, int(port))


async def _send_loop(endpoint: str, topic: str, opts: dict[str, Any]) -> dict[str, Any]:
    from data_plane.proxy.v2 import definition_pb2 as pb
    from data_plane.proxy.v2 import service_pb2 as rpc

    requests = Requests(topic, os.urandom(opts["message_bytes"]), opts["batch"])
    n = opts["batch"]
    lat_us = latency_log()
    acked = errors = 0
    measure_from = time.perf_counter() + opts["warmup_s"]
    stop_at = measure_from + opts["seconds"]
    channel = await _channel(endpoint)
    try:

        async def lane() -> None:
            nonlocal acked, errors
            while (t0 := time.perf_counter()) < stop_at:
                req = requests.next()
                try:
                    r = await asyncio.wait_for(channel.unary("SendMessage", req, rpc.SendMessageResponse), 10)
                except (CallError, TimeoutError):
                    errors += 1
                    continue
                if r.status.code != pb.OK:
                    errors += 1
                    continue
                if t0 >= measure_from:
                    acked += n
                    lat_us.append(int((time.perf_counter() - t0) * 1e6))

        await asyncio.gather(*(lane() for _ in range(opts["lanes"])))
    finally:
        channel.close()
    return {"acked": acked, "errors": errors, "hist": encode_hist(hist_of(lat_us))}


async def _open_loop(endpoint: str, topic: str, opts: dict[str, Any]) -> dict[str, Any]:
    from data_plane.proxy.v2 import definition_pb2 as pb
    from data_plane.proxy.v2 import service_pb2 as rpc

    requests = Requests(topic, os.urandom(opts["message_bytes"]), 1)
    rate = opts["rate"]
    lat_us = latency_log()
    acked = errors = 0
    start = time.perf_counter()
    measure_from = start + opts["warmup_s"]
    stop_at = measure_from + opts["seconds"]
    pending: set[asyncio.Task[None]] = set()
    channel = await _channel(endpoint)
    try:

        async def one(due: float) -> None:
            nonlocal acked, errors
            req = requests.next()
            try:
                r = await asyncio.wait_for(channel.unary("SendMessage", req, rpc.SendMessageResponse), 10)
            except (CallError, TimeoutError):
                errors += 1
                return
            if r.status.code != pb.OK:
                errors += 1
            elif due >= measure_from:
                acked += 1
                lat_us.append(int((time.perf_counter() - due) * 1e6))  # from when it was due

        i = 0
        while (due := start + i / rate) < stop_at:
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            task = asyncio.get_running_loop().create_task(one(due))
            pending.add(task)
            task.add_done_callback(pending.discard)
            i += 1
        if pending:
            await asyncio.wait(pending, timeout=15)
    finally:
        channel.close()
    return {"acked": acked, "errors": errors, "hist": encode_hist(hist_of(lat_us))}


async def _receive_ack(endpoint: str, topic: str, opts: dict[str, Any]) -> dict[str, Any]:
    from google.protobuf.duration_pb2 import Duration

    from data_plane.proxy.v2 import definition_pb2 as pb
    from data_plane.proxy.v2 import service_pb2 as rpc

    group = pb.Resource(name=opts["group"])
    consumed = errors = 0
    first = last = 0.0
    idle_until = [time.perf_counter() + opts["idle_s"]]
    deadline = time.perf_counter() + opts["timeout_s"]
    channel = await _channel(endpoint)
    try:

        async def receiver(qid: int) -> None:
            nonlocal consumed, errors, first, last
            mq = pb.MessageQueue(topic=pb.Resource(name=topic), id=qid)
            while time.perf_counter() < min(deadline, idle_until[0]):
                req = rpc.ReceiveMessageRequest(
                    group=group, message_queue=mq, batch_size=BATCH, auto_renew=False,
                    filter_expression=pb.FilterExpression(type=pb.TAG, expression="*"),
                    invisible_duration=Duration(seconds=60), long_polling_timeout=Duration(seconds=1),
                )  # fmt: skip
                handles: list[Any] = []
                try:
                    got = await asyncio.wait_for(
                        channel.server_stream("ReceiveMessage", req, rpc.ReceiveMessageResponse), 10
                    )
                except (CallError, TimeoutError):
                    errors += 1
                    continue
                for r in got:
                    if r.HasField("message"):
                        sp = r.message.system_properties
                        handles.append(rpc.AckMessageEntry(message_id=sp.message_id, receipt_handle=sp.receipt_handle))
                if not handles:
                    continue
                try:
                    ack = await asyncio.wait_for(
                        channel.unary(
                            "AckMessage",
                            rpc.AckMessageRequest(group=group, topic=mq.topic, entries=handles),
                            rpc.AckMessageResponse,
                        ),
                        10,
                    )
                except (CallError, TimeoutError):
                    errors += 1
                    continue
                if ack.status.code != pb.OK:
                    errors += 1
                    continue
                now = time.perf_counter()
                first = first or now
                last = now
                consumed += len(handles)
                idle_until[0] = now + opts["idle_s"]

        await asyncio.gather(*(receiver(q) for q in opts["queues"]))
    finally:
        channel.close()
    return {"consumed": consumed, "errors": errors, "first": first, "last": last}


def worker(kind: str, endpoint: str, topic: str, opts: dict[str, Any]) -> dict[str, Any]:
    fn = {"send": _send_loop, "open_loop": _open_loop, "receive_ack": _receive_ack}[kind]
    try:
        import uvloop

        result: dict[str, Any] = uvloop.run(fn(endpoint, topic, opts))
    except ImportError:
        result = asyncio.run(fn(endpoint, topic, opts))
    return result


def _pool_run(jobs: list[tuple[str, str, str, dict[str, Any]]]) -> list[dict[str, Any]]:
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(len(jobs)) as pool:
        return pool.starmap(worker, jobs)


def run_phases(
    endpoint: str, base: dict[str, Any], queues: int, result: dict[str, Any], log: Callable[[str], None]
) -> None:
    """The four gRPC phases against ``endpoint`` (the topics ``bench-grpc``, ``bench-grpc-unary``
    and ``bench-grpc-lat`` exist); their figures into ``result``."""
    seconds = base["seconds"]
    common = {"message_bytes": base["message_bytes"], "seconds": seconds, "warmup_s": base["warmup_s"]}

    def sends(name: str, topic: str, batch: int, latency: str) -> None:
        rs = _pool_run([("send", endpoint, topic, {**common, "batch": batch, "lanes": 8}) for _ in range(2)])
        result[name] = {
            "msgs_per_s": round(sum(r["acked"] for r in rs) / seconds),
            "errors": sum(r["errors"] for r in rs),
            latency: summary_ms(merge([r["hist"] for r in rs])),
        }
        log(f"  {result[name]}")

    log("gRPC: SendMessage, 32 messages a call, 8 calls in flight in each of 2 processes")
    sends("grpc_batched", "bench-grpc", BATCH, "call_latency_ms")
    log("gRPC: 16 unary senders (one message a call), in 2 processes")
    sends("grpc_unary_16", "bench-grpc-unary", 1, "send_latency_ms")

    log("gRPC: ReceiveMessage + AckMessage of what the batched phase stored (2 processes, 4 receivers each)")
    half = [list(range(queues))[i::2] for i in range(2)]
    rs = _pool_run(
        [("receive_ack", endpoint, "bench-grpc", {"group": "bench-grpc-pop", "queues": q,
                                                  "idle_s": min(3.0, seconds), "timeout_s": 300}) for q in half]
    )  # fmt: skip
    consumed = sum(r["consumed"] for r in rs)
    firsts = [r["first"] for r in rs if r["consumed"]]
    span = max(r["last"] for r in rs) - min(firsts) if firsts else 0
    result["grpc_receive_ack"] = {
        "msgs_per_s": round(consumed / span) if span > 0 else 0,
        "consumed": consumed,
        "errors": sum(r["errors"] for r in rs),
    }
    log(f"  {result['grpc_receive_ack']}")

    rate = max(100.0, result["grpc_unary_16"]["msgs_per_s"] / 2)
    log(f"gRPC: open-loop SendMessage at {rate:.0f} msgs/s (half the unary peak)")
    (alone,) = _pool_run([("open_loop", endpoint, "bench-grpc-lat", {**common, "rate": rate})])
    result["grpc_half_peak"] = {
        "target_msgs_per_s": round(rate),
        "acked": alone["acked"],
        "errors": alone["errors"],
        "send_latency_ms": summary_ms(merge([alone["hist"]])),
    }
    log(f"  {result['grpc_half_peak']}")
