"""The quota's hot-path costs: ``python -m benchmarks.quota`` prints the nanoseconds of one
bucket call (limited, default limits, unlimited) and of a send refused straight off its frame
(``BrokerTenancy.refuse_send_early``: read the frame's fields, ask the bucket, write the answer)."""

from __future__ import annotations

import time

from data_plane.remoting.codes import RequestCode
from data_plane.remoting.command import RemotingCommand, encode_bytes
from data_plane.remoting.send_frame import flow_control_frame, send_fields
from data_plane.tenancy.namespace import tenant_of
from data_plane.tenancy.quota import Limits, QuotaManager, flow_control_remark


def main(n: int = 1_000_000) -> None:
    """The cost of one hot-path call, printed."""
    q = QuotaManager(default_limits=Limits(publish_msgs_per_s=1e12, publish_bytes_per_s=1e15))
    q.set_limits("t1", Limits(publish_msgs_per_s=1e12, publish_bytes_per_s=1e15))
    unlimited = QuotaManager()
    for name, fn, tenant in (
        ("acquire_publish (limited tenant)", q.acquire_publish, "t1"),
        ("acquire_consume (default limits)", q.acquire_consume, "t2"),
        ("acquire_publish (no limits)", unlimited.acquire_publish, "t1"),
    ):
        t0 = time.perf_counter()
        for _ in range(n):
            fn(tenant, 1, 1024)
        dt = time.perf_counter() - t0
        print(f"{name:40s} {dt / n * 1e9:8.0f} ns/call")
    _bench_early_refusal(n // 10)


def _bench_early_refusal(n: int) -> None:
    """What the broker's frame path does to refuse a send over quota (BrokerTenancy.
    refuse_send_early): read the frame's fields, ask the bucket, write the FLOW_CONTROL frame."""
    ext = {"a": "t1%g", "b": "t1%orders", "c": "TBW102", "d": "4", "e": "0", "f": "0", "g": "1700000000000",
           "h": "0", "i": "UNIQ_KEY\u0001AC110001\u0002", "j": "0", "k": "false", "m": "false",
           "Authorization": "Bearer " + "x" * 400}  # fmt: skip
    frame = memoryview(
        encode_bytes(RemotingCommand(RequestCode.SEND_MESSAGE_V2, opaque=7, ext_fields=ext, body=b"x" * 1024))
    )[4:]
    q = QuotaManager(stagger_refusals=True)
    q.set_limits("t1", Limits(publish_msgs_per_s=1.0, burst_s=1.0))
    q.acquire_publish("t1", 1, 1024)  # the bucket emptied: every look below refuses
    t0 = time.perf_counter()
    for _ in range(n):
        f = send_fields(frame, 0)
        assert f is not None
        if tenant_of(f[2]) == "t1":
            wait_ms = q.refuse_publish("t1", 1, len(f[9]))
            flow_control_frame(f[1], f[0], flow_control_remark("t1", "publish", wait_ms, 1.0))
    dt = time.perf_counter() - t0
    print(f"{'a send refused off its frame':40s} {dt / n * 1e9:8.0f} ns/call")


if __name__ == "__main__":
    main()
