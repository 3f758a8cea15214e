#!/usr/bin/env python3
"""Register a broker group and its hosts with Orbit's control plane (the fleet API), or issue the
broker credential of one of its hosts, for the broker_group module's local-exec provisioners.
Standard library only.

Environment: ORBIT_CONTROL_PLANE_URL; ORBIT_CLIENT_ID and ORBIT_CLIENT_SECRET (an operator
credential); then either ORBIT_BROKER_GROUP: {name, namesrv_addrs, broker_addrs, max_queues,
max_msgs_per_s, storage_bytes, hosts: [{broker_id, host, address}]} to register the group, or
ORBIT_HOST_CREDENTIAL: {broker_group, host, file} to issue the credential of that host (the host
part of one of the group's broker_addrs; issuing again rotates it) into a new 0600 file
{"access_key", "secret"} (its directory made 0700).

Registering is idempotent: a group that exists is brought up to date (PATCH); hosts are upserted.
Secrets are sent only to the token endpoint, written only to the credential file, never printed.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import sys
import urllib.error
import urllib.parse
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


def login(url: str) -> dict[str, str]:
    """The operator's bearer token header (client-credentials grant)."""
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
    return {"Authorization": f"Bearer {answer['access_token']}"}


def register(url: str, auth: dict[str, str], group: dict[str, Any]) -> None:
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


def issue_host_credential(url: str, auth: dict[str, str], wanted: dict[str, str]) -> None:
    group, host, path = wanted["broker_group"], wanted["host"], wanted["file"]
    quoted = urllib.parse.quote(group, safe=""), urllib.parse.quote(host, safe="")
    where = f"/v1/fleet/broker-groups/{quoted[0]}/hosts/{quoted[1]}/credential"
    status, answer = call(url, "POST", where, None, auth)
    if status not in (200, 201):
        fail(f"POST {where}", status, answer)
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)  # a file left by an interrupted apply: made anew, 0600 from the start
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"access_key": answer["access_key"], "secret": answer["secret"]}, f)
    print(f"orbit registration: host {host} of broker group {group} has credential {answer['access_key']}")


def main() -> None:
    url = os.environ["ORBIT_CONTROL_PLANE_URL"].rstrip("/")
    auth = login(url)
    if "ORBIT_HOST_CREDENTIAL" in os.environ:
        issue_host_credential(url, auth, json.loads(os.environ["ORBIT_HOST_CREDENTIAL"]))
    else:
        register(url, auth, json.loads(os.environ["ORBIT_BROKER_GROUP"]))


if __name__ == "__main__":
    main()
