"""What ``orbit dev up`` asks the control plane for, once it serves: a credential for the broker
(usage reports), the broker group with the broker's address, and a demo tenant — topic
``hello``, consumer group ``demo-consumers`` and a credential — so that both the SDK and a stock
RocketMQ client can be tried at once.

Every step is idempotent: a second ``dev up`` on the same directory finds what the first made
(secrets are shown once by the API, so the credentials are kept in 0600 files under the data
directory and reused). A tiny synchronous JSON client over urllib is all this needs.
"""

from __future__ import annotations

import base64
import json
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

from data_plane.tls import client_context_from_env

DEMO_TENANT = "demo"
DEMO_TOPIC = "hello"
DEMO_GROUP = "demo-consumers"
REQUEST_TIMEOUT_S = 10.0


class BootstrapError(RuntimeError):
    """The control plane refused a bootstrap step; the message says which and why."""


def write_private_json(path: str, doc: dict[str, Any]) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(doc, f)
        f.write("\n")
    os.replace(tmp, path)


def read_credentials(path: str) -> tuple[str, str] | None:
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return None
    ak, secret = doc.get("access_key"), doc.get("secret")
    return (ak, secret) if isinstance(ak, str) and isinstance(secret, str) else None


class ControlPlaneAPI:
    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        self._token = ""

    def login(self, access_key: str, secret: str) -> None:
        basic = base64.b64encode(f"{access_key}:{secret}".encode()).decode()
        req = urllib.request.Request(
            self.url + "/oauth/token",
            data=urllib.parse.urlencode({"grant_type": "client_credentials"}).encode(),
            headers={"Authorization": f"Basic {basic}", "Content-Type": "application/x-www-form-urlencoded"},
        )
        status, body = self._send(req)
        if status != 200:
            raise BootstrapError(f"the control plane refused the operator credential: {status} {body}")
        self._token = str(body["access_token"])

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {self._token}"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        return self._send(urllib.request.Request(self.url + path, data=data, headers=headers, method=method))

    def ok(self, method: str, path: str, body: dict[str, Any] | None = None, *, accept: tuple[int, ...] = ()) -> Any:
        status, doc = self.call(method, path, body)
        if status >= 300 and status not in accept:
            raise BootstrapError(f"{method} {path}: {status} {doc}")
        return doc

    @staticmethod
    def _send(req: urllib.request.Request) -> tuple[int, Any]:
        try:
            with urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT_S, context=client_context_from_env()) as resp:
                raw = resp.read()
                return resp.status, json.loads(raw) if raw else None
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                return e.code, json.loads(raw)
            except ValueError:
                return e.code, raw.decode(errors="replace")


def operator_api(url: str, operator_file: str) -> ControlPlaneAPI:
    creds = read_credentials(operator_file)
    if creds is None:
        raise BootstrapError(f"no operator credential in {operator_file}")
    api = ControlPlaneAPI(url)
    api.login(*creds)
    return api


def ensure_broker_credential(api: ControlPlaneAPI, path: str) -> None:
    """A credential of role ``broker`` for usage reports, kept in ``path`` (0600)."""
    if read_credentials(path) is not None:
        return
    made = api.ok("POST", "/v1/admin/credentials", {"role": "broker", "description": "orbit dev up broker"})
    write_private_json(path, {"access_key": made["access_key"], "secret": made["secret"]})


def ensure_broker_group(api: ControlPlaneAPI, name: str, broker_addrs: list[str], namesrv_addr: str) -> None:
    """The broker group with every member's address (master and slaves: the reconciler gives
    each the group's topics and tenants, so any of them can serve after a failover)."""
    status, group = api.call("GET", f"/v1/fleet/broker-groups/{name}")
    if status == 404:
        api.ok(
            "POST",
            "/v1/fleet/broker-groups",
            {
                "name": name,
                "namesrv_addrs": [namesrv_addr],
                "broker_addrs": broker_addrs,
                "max_queues": 10_000,
                "max_msgs_per_s": 100_000,
                "storage_bytes": 100 * 1024**3,
            },
        )
    elif status == 200:
        if group.get("broker_addrs") != broker_addrs or group.get("namesrv_addrs") != [namesrv_addr]:
            api.ok(
                "PATCH",
                f"/v1/fleet/broker-groups/{name}",
                {"broker_addrs": broker_addrs, "namesrv_addrs": [namesrv_addr]},
            )
    else:
        raise BootstrapError(f"GET broker group {name}: {status} {group}")


@dataclass(frozen=True)
class Demo:
    tenant: str
    topic: str  # the wire name clients use: tenant%topic
    group: str  # likewise
    access_key: str
    secret: str
    credentials_file: str


def ensure_demo(api: ControlPlaneAPI, credentials_file: str, *, wait_s: float = 60.0) -> Demo:
    t = DEMO_TENANT
    status, _ = api.call("GET", f"/v1/tenants/{t}")
    if status == 404:
        api.ok("POST", "/v1/tenants", {"id": t, "plan": "standard", "display_name": "Demo tenant"})
    api.ok("POST", f"/v1/tenants/{t}/topics", {"name": DEMO_TOPIC, "message_type": "NORMAL"}, accept=(409,))
    api.ok("POST", f"/v1/tenants/{t}/groups", {"name": DEMO_GROUP}, accept=(409,))
    creds = read_credentials(credentials_file)
    if creds is None:
        made = api.ok("POST", f"/v1/tenants/{t}/credentials", {"description": "orbit dev up demo"})
        creds = (made["access_key"], made["secret"])
    # With the control plane's URL of this run: the CLI asks it for what name servers tell
    # operators only (``orbit topic list`` with a tenant credential).
    write_private_json(credentials_file, {"access_key": creds[0], "secret": creds[1], "control_plane": api.url})
    deadline = time.monotonic() + wait_s
    while True:  # the reconciler creates the topic on the broker, then marks it active
        topic = api.ok("GET", f"/v1/tenants/{t}/topics/{DEMO_TOPIC}")
        if topic.get("status") == "active":
            break
        if time.monotonic() > deadline:
            raise BootstrapError(f"topic {t}%{DEMO_TOPIC} is still {topic.get('status')!r} after {wait_s:.0f} s")
        time.sleep(0.2)
    return Demo(t, f"{t}%{DEMO_TOPIC}", f"{t}%{DEMO_GROUP}", creds[0], creds[1], credentials_file)
