"""The machine's own limits, measured in the same run as the load, so Orbit's figures can be
read as a share of what the hardware allows rather than as bare numbers:

* ``disk``: sequential write bandwidth of the disk holding the data directory — 1 MiB writes
  and one ``fdatasync`` (``benchmarks.machine.disk_seq_write``, the store benchmark's
  yardstick too);
* ``loopback_tcp``: bytes per second one process sends another over 127.0.0.1 (256 KiB writes,
  the receiver reading as fast as it can) — what any broker on this machine shares with its
  clients.
"""

from __future__ import annotations

import multiprocessing
import os
import socket
import time
from typing import Any

from benchmarks.machine import disk_seq_write

CHUNK_BYTES = 256 * 1024


def _receiver(port_q: Any, result_q: Any) -> None:
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(1)
        port_q.put(srv.getsockname()[1])
        conn, _ = srv.accept()
        total = 0
        with conn:
            buf = bytearray(CHUNK_BYTES)
            while n := conn.recv_into(buf):
                total += n
        result_q.put(total)


def loopback_tcp(seconds: float = 2.0) -> dict[str, float]:
    """One sender process (this one) and one receiver process for ``seconds``."""
    ctx = multiprocessing.get_context("spawn")
    port_q, result_q = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=_receiver, args=(port_q, result_q))
    proc.start()
    try:
        port = port_q.get(timeout=30)
        block = os.urandom(CHUNK_BYTES)
        sent = 0
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < seconds:
                s.sendall(block)
                sent += len(block)
            s.shutdown(socket.SHUT_WR)
            received = result_q.get(timeout=60)
            dt = time.perf_counter() - t0
    finally:
        proc.join(30)
        if proc.is_alive():
            proc.kill()
    return {"seconds": round(dt, 3), "megabytes": round(received / 1e6, 1), "mb_per_s": round(received / dt / 1e6, 1)}


def measure(data_dir: str, *, disk_mb: int = 256, tcp_seconds: float = 2.0) -> dict[str, Any]:
    os.makedirs(data_dir, exist_ok=True)
    return {"disk_seq_write": disk_seq_write(data_dir, disk_mb), "loopback_tcp": loopback_tcp(tcp_seconds)}
