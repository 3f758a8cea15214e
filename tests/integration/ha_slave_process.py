"""A slave in its own process, for the kill -9 test::

    python tests/integration/ha_slave_process.py <store_dir> <master_port>

Opens a MessageStore on ``store_dir`` (tests.ha_support geometry), replicates 127.0.0.1:<port>
into it and prints ``READY`` once started; SIGTERM stops it cleanly.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys

if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from data_plane.store import MessageStore
from data_plane.store.ha import HAClient
from tests.ha_support import ha_config


async def run(store_dir: str, port: int) -> None:
    store = MessageStore(ha_config(store_dir))
    store.start()
    client = HAClient(store, "127.0.0.1", port, report_interval_ms=50, reconnect_initial_ms=20)
    client.start()
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    print("READY", flush=True)
    await stop.wait()
    await client.stop()
    store.shutdown()


if __name__ == "__main__":
    asyncio.run(run(sys.argv[1], int(sys.argv[2])))
