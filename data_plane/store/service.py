"""ServiceThread: the store's background loops (flush, reserve-ahead) share this shape."""

from __future__ import annotations

import logging
import threading

log = logging.getLogger(__name__)


class ServiceThread:
    """A named daemon thread with a stop flag and a wake-up event."""

    name = "orbit-service"

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._wakeup = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run_safely, name=self.name, daemon=True)
        self._thread.start()

    def wait_for_running(self, interval_s: float) -> bool:
        """Sleep up to ``interval_s`` or until woken; False once stopping."""
        self._wakeup.wait(interval_s)
        self._wakeup.clear()
        return not self._stop.is_set()

    def stop(self) -> None:
        self._stop.set()
        self._wakeup.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None

    def _run_safely(self) -> None:
        try:
            self.run()
        except Exception:  # a service thread must say why it died
            log.exception("%s stopped on an error", self.name)

    def run(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError
