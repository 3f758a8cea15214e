"""An elastic case's cluster and what is watched of it (docs/elasticity.md, "The ramp scenario").

``cluster_options`` gives LocalCluster the case's broker groups, the control plane's autoscaler
settings (its ``ORBIT_*`` environment) and the brokers' load report interval. ``make_tenant``
makes the one tenant through the control plane's HTTP API as the operator — the enterprise
plan, the case's publish quota, the topic with its throughput hint (FIFO when the case is
ordered), the consumer group and the tenant's credential — and waits until the topic is active.
After that the tenant does nothing but publish and consume: every change of queues is the
autoscaler's. ``QueueWatch`` reads the topic's writable and readable queues from the API every
``sample_s`` (as the operator, GET only) in a thread of the parent while the case runs, and its
scaling events at the end.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from loadtest.scenario import Autoscale, Case
from loadtest.targets import TargetUnavailable, TenantAccess, group_names, topic_names

TENANT = "lt-elastic"
ACTIVE_TIMEOUT_S = 60.0


def cluster_options(auto: Autoscale) -> tuple[dict[str, Any], list[str]]:
    """LocalCluster options and broker flags for the case's elastic cluster."""
    env = {
        "ORBIT_AUTOSCALE_INTERVAL_S": str(auto.interval_s),
        "ORBIT_QUEUE_CAPACITY_MSGS_PER_S": str(auto.queue_capacity_msgs_per_s),
        "ORBIT_SCALE_WINDOW_S": str(auto.window_s),
        "ORBIT_SCALE_DOWN_AFTER_S": str(auto.down_after_s),
    }
    options = {"broker_groups": auto.broker_groups, "control_plane_env": env}
    return options, ["--set", f"load_report_interval_s={auto.load_report_interval_s}"]


def operator(url: str, root: str) -> Any:
    """The control plane's API client, logged in as the cluster's operator."""
    from data_plane.dev_tenancy import operator_api

    return operator_api(url, os.path.join(root, "control-plane", "operator.json"))


def make_tenant(url: str, root: str, case: Case, spec: dict[str, Any]) -> TenantAccess:
    """The case's tenant, topic and group, made through the API as the operator."""
    auto = case.autoscale
    assert auto is not None
    api = operator(url, root)
    t = TENANT
    api.ok("POST", "/v1/tenants", {"id": t, "plan": "enterprise", "display_name": "load test: elastic"})
    api.ok("PUT", f"/v1/tenants/{t}/quota", {"publish_msgs_per_s": auto.publish_quota_msgs_per_s})
    topic = topic_names(case)[0]
    api.ok("POST", f"/v1/tenants/{t}/topics", {
        "name": topic, "message_type": "FIFO" if case.ordered else "NORMAL",
        "throughput_hint_msgs_per_s": auto.throughput_hint_msgs_per_s,
    })  # fmt: skip
    for name in group_names(case):
        api.ok("POST", f"/v1/tenants/{t}/groups", {"name": name})
    made = api.ok("POST", f"/v1/tenants/{t}/credentials", {"description": "orbit loadtest"})
    creds = {"access_key": made["access_key"], "secret": made["secret"], "token_url": url + "/oauth/token"}
    deadline = time.monotonic() + ACTIVE_TIMEOUT_S
    while api.ok("GET", f"/v1/tenants/{t}/topics/{topic}").get("status") != "active":
        if time.monotonic() > deadline:
            raise TargetUnavailable(f"topic {t}%{topic} did not become active within {ACTIVE_TIMEOUT_S:.0f} s")
        time.sleep(0.2)
    access = TenantAccess(t, topic_names(case, t), group_names(case, t), {**spec, "credentials": creds})
    return access


def queue_counts(topic: dict[str, Any]) -> tuple[int, int]:
    """(writable, readable) queues of a topic as the API shows it, over its placements."""
    places = topic.get("placements") or []
    return sum(int(p["write_queue_count"]) for p in places), sum(int(p["queue_count"]) for p in places)


class QueueWatch:
    """Samples the topic's queues every ``every_s`` in a thread until ``stop()`` (logging in
    again when the operator's token has expired)."""

    def __init__(self, url: str, root: str, tenant: str, topic: str, every_s: float) -> None:
        self.url, self.root, self.tenant, self.topic, self.every_s = url, root, tenant, topic, every_s
        self.api = operator(url, root)
        self.samples: list[tuple[float, int, int]] = []  # (wall s, writable, readable)
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="queue-watch", daemon=True)

    @property
    def path(self) -> str:
        return f"/v1/tenants/{self.tenant}/topics/{self.topic}"

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while True:
            try:
                status, body = self.api.call("GET", self.path)
                if status == 401:
                    self.api = operator(self.url, self.root)
                    status, body = self.api.call("GET", self.path)
                if status == 200:
                    self.samples.append((time.time(), *queue_counts(body)))
                else:
                    self.errors += 1
            except Exception:  # a slow or restarting control plane: a gap in the samples, counted
                self.errors += 1
            if self._stop.wait(self.every_s):
                return

    def stop(self) -> dict[str, Any]:
        """Stop sampling; the samples and the topic's scaling events (wall-clock times)."""
        self._stop.set()
        self._thread.join(30)
        events: list[dict[str, Any]] = []
        try:
            status, body = self.api.call("GET", self.path + "/scaling-events")
            if status == 200:
                events = list(reversed(body.get("events", [])))  # oldest first
        except Exception:
            self.errors += 1
        return {"samples": self.samples, "events": events, "errors": self.errors}
