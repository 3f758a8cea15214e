#!/usr/bin/env python3
"""Register a broker group and its hosts with Orbit's control plane (the fleet API), for the
broker_group module's local-exec provisioner. Standard library only.

Environment: ORBIT_CONTROL_PLANE_URL; ORBIT_CLIENT_ID and ORBIT_CLIENT_SECRET (an operator
credential); ORBIT_BROKER_GROUP: {name, namesrv_addrs, broker_addrs, max_queues, max_msgs_per_s,
storage_bytes, hosts: [{broker_id, host, address}]}.

Idempotent: a group that exists is brought up to date (PATCH); hosts are upserted. The secret is
sent only to the token endpoint and never printed.
"""

from __future__ import annotations

import base64
import json
import os
import sys
import urllib.error
import urllib.request
from typing import Any


def call(url: str, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    sent = dict(headers or {})
    if body is not None and not isinstance(body, bytes):
        sent["Content-Type"] = "application/json"
    request = urllib.request.Request(url + path, data=data, method=method, headers=sent)
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as e:
        status, raw = e.code, e.read()
    try:
        return status, json.loads(raw) if raw else None
    except ValueError:
        return status, raw.decode(errors="replace")


def fail(what: str, status: int, answer: Any) -> None:
    error = answer.get("error") if isinstance(answer, dict) else None
    if isinstance(error, dict):
        detail = f"{error.get('code')}: {error.get('message')}"
    elif isinstance(error, str):
        detail = f"{error}: {answer.get('error_description', '')}"
    else:
        detail = str(answer)[:300]
    sys.exit(f"orbit registration: {what} answered {status} {detail}")


def main() -> None:
    url = os.environ["ORBIT_CONTROL_PLANE_URL"].rstrip("/")
    group = json.loads(os.environ["ORBIT_BROKER_GROUP"])
    basic = base64.b64encode(f"{os.environ['ORBIT_CLIENT_ID']}:{os.environ['ORBIT_CLIENT_SECRET']}".encode()).decode()
    status, answer = call(
        url,
        "POST",
        "/oauth/token",
        b"grant_type=client_credentials",
        {"Authorization": f"Basic {basic}", "Content-Type": "application/x-www-form-urlencoded"},
    )
    if status != 200:
        fail("POST /oauth/token", status, answer)
    auth = {"Authorization": f"Bearer {answer['access_token']}"}
    spec = {k: group[k] for k in ("namesrv_addrs", "broker_addrs", "max_queues", "max_msgs_per_s", "storage_bytes")}
    name = group["name"]
    status, answer = call(url, "POST", "/v1/fleet/broker-groups", {"name": name, **spec}, auth)
    if status == 409:
        status, answer = call(url, "PATCH", f"/v1/fleet/broker-groups/{name}", spec, auth)
        if status != 200:
            fail(f"PATCH /v1/fleet/broker-groups/{name}", status, answer)
        print(f"orbit registration: broker group {name} updated")
    elif status == 201:
        print(f"orbit registration: broker group {name} created")
    else:
        fail("POST /v1/fleet/broker-groups", status, answer)
    for host in group["hosts"]:
        status, answer = call(url, "POST", f"/v1/fleet/broker-groups/{name}/hosts", host, auth)
        if status not in (200, 201):
            fail(f"POST /v1/fleet/broker-groups/{name}/hosts", status, answer)
        print(f"orbit registration: host {host['host']} is broker {name} id {host['broker_id']} at {host['address']}")


if __name__ == "__main__":
    main()
