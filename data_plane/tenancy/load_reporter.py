"""LoadReporter: every ``interval_s`` a master broker sends its load report (load_report.py) to
the control plane.

    loop: wait interval_s
          not the master now → nothing (a slave's figures are its master's)
          report = LoadReports.build(topics, consumer offsets, queues' max offsets, refusals)
          POST {control_plane_url}/internal/v1/load   Authorization: Bearer <token()>
          2xx   → the report's items count as sent; the refusals it carried are taken off the counts
          other → logged; the next interval builds a fresh report (a gauge: nothing is spooled)

The report is built on the event loop, between requests: a pass over the topic table, each
tenant topic's queues (a ConsumeQueue's max offset, from its mapped files' positions in memory)
and the consumer offset table; no disk read, no lock.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping

from data_plane.remoting.bodies import TopicConfig
from data_plane.tenancy.load_report import LoadReports, MaxOffset, Report
from data_plane.tenancy.report_poster import ReportError, ReportPoster, TokenSource

log = logging.getLogger(__name__)

LOAD_PATH = "/internal/v1/load"


class LoadReporter:
    def __init__(
        self,
        reports: LoadReports,
        *,
        control_plane_url: str,
        token: TokenSource,
        interval_s: float,
        topics: Callable[[], Mapping[str, TopicConfig]],
        offset_table: Callable[[], Mapping[str, Mapping[int, int]]],
        max_offset: MaxOffset,
        refused: Counter[str],
        is_master: Callable[[], bool],
        request_timeout_s: float = 10.0,
    ) -> None:
        self.reports = reports
        self.poster = ReportPoster(control_plane_url, LOAD_PATH, token, request_timeout_s=request_timeout_s)
        self.interval_s = interval_s
        self._topics = topics
        self._offset_table = offset_table
        self._max_offset = max_offset
        self.refused = refused  # wire topic -> refusals not reported yet (BrokerTenancy counts them)
        self._is_master = is_master
        # figures for logs and tests
        self.reports_sent = 0
        self.failures = 0
        self.last_error = ""

    async def run(self) -> None:
        try:
            while True:
                await asyncio.sleep(self.interval_s)
                if self._is_master():
                    await self.report_once()
        finally:
            await self.poster.close()

    def build(self) -> Report:
        return self.reports.build(
            now_s=time.time(),
            topics=self._topics(),
            offset_table=self._offset_table(),
            max_offset=self._max_offset,
            refused=self.refused,
        )

    async def report_once(self) -> bool:
        """Build and send one report; whether it reached the control plane."""
        report = self.build()
        if not report.items:
            return True
        try:
            await self.poster.post(report.doc)
        except ReportError as e:
            self.failures += 1
            self.last_error = str(e)
            log.warning("load report to %s failed (%s): the next one in %.1f s", self.poster.url, e, self.interval_s)
            return False
        self.reports.sent(report, now_s=report.doc["at"] / 1000)
        self.refused.subtract(report.refused)
        topics = self._topics()
        for topic in [t for t, n in self.refused.items() if n <= 0 or t not in topics]:
            del self.refused[topic]
        self.reports_sent += 1
        return True
