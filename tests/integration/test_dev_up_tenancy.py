"""``orbit dev up`` as the managed service in miniature: the control plane (on its own embedded
PostgreSQL), a name server and a broker with authentication on, a demo tenant whose printed
credentials work with the CLI — and nothing works without them. Ctrl-C stops every child."""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
from pathlib import Path
from urllib.parse import urlparse

import pytest

from tests import rocketmq5_client
from tests.integration.helpers import orbit, start_dev_up

DEADLINE_S = 120.0


def _refused(addr: str) -> None:
    host, port = addr.rsplit(":", 1)
    with pytest.raises(ConnectionRefusedError), socket.create_connection((host, int(port)), timeout=1):
        pass


def test_dev_up_serves_a_demo_tenant_whose_printed_credentials_work(tmp_path: Path) -> None:
    ready = tmp_path / "dev.ready"
    data = tmp_path / "data"
    proc, info = start_dev_up(data, ready, "--control-plane-port", "0", timeout_s=DEADLINE_S)
    try:
        demo = info["demo"]
        assert demo["topic"] == "demo%hello"
        creds_file = Path(demo["credentials_file"])
        assert stat.S_IMODE(creds_file.stat().st_mode) == 0o600, "the demo secret is kept private"
        creds = json.loads(creds_file.read_text())

        base = {k: v for k, v in os.environ.items() if not k.startswith("ORBIT_")}
        base["ORBIT_NAMESRV"] = info["namesrv"]
        anonymous = orbit(base, "produce", "--topic", demo["topic"], "--body", "x")
        assert anonymous.returncode != 0
        assert "code 16" in anonymous.stderr
        assert "no credentials" in anonymous.stderr

        env = dict(base, ORBIT_CREDENTIALS_FILE=str(creds_file))
        sent = orbit(env, "produce", "--topic", demo["topic"], "--json", stdin="one\ntwo\n")
        assert sent.returncode == 0, sent.stderr
        assert [json.loads(line)["status"] for line in sent.stdout.splitlines()] == ["SEND_OK", "SEND_OK"]
        got = orbit(
            env, "consume", "--topic", demo["topic"], "--group", demo["group"], "--earliest", "--max", "2", "--json"
        )
        assert got.returncode == 0, got.stderr
        assert sorted(json.loads(line)["body"] for line in got.stdout.splitlines()) == ["one", "two"]

        # The RocketMQ 5 clients' endpoint, listed as grpc: the official Python client with the demo
        # tenant's access key and namespace, plain names.
        v5_args = {"endpoint": info["grpc"], "ak": creds["access_key"], "sk": creds["secret"], "namespace": "demo"}
        home = tmp_path / "v5-home"
        v5_sent = rocketmq5_client.run(
            "produce", {**v5_args, "topic": "hello", "messages": [{"body": "v5"}]}, home=home
        )
        assert len(v5_sent["sent"]) == 1
        # (the demo group: what the 4.x consumer above committed is behind it, so "v5" is there)
        v5_got = rocketmq5_client.run(
            "simple", {**v5_args, "topic": "hello", "group": "demo-consumers", "count": 3, "timeout_s": 5}, home=home
        )
        assert "v5" in [m["body"] for m in v5_got["received"]], v5_got

        # Another tenant's namespace is refused even with valid credentials.
        other = orbit(env, "produce", "--topic", "other%x", "--body", "x")
        assert other.returncode != 0
        assert "code 16" in other.stderr

        # Cluster status is operators' business: a tenant is told so; an operator sees the master
        # and its slave, the slave not marked fenced.
        status = orbit(env, "cluster", "status")
        assert status.returncode == 2, status.stdout + status.stderr
        assert "not permitted (tenant credential; operators only)" in status.stderr
        operator = dict(base, ORBIT_CREDENTIALS_FILE=info["operator_credentials_file"])
        table = orbit(operator, "cluster", "status")
        assert table.returncode == 0, table.stderr
        rows = [line.split() for line in table.stdout.splitlines()[1:]]
        assert {(r[0], r[1], r[3]) for r in rows} == {("broker-a", "0", "SYNC_MASTER"), ("broker-a", "1", "SLAVE")}
        assert "(fenced)" not in table.stdout
        # Topics: a tenant's come from the control plane (dev up's credentials file names it);
        # an operator's from the name servers, every tenant's and the system's.
        listed = orbit(env, "topic", "list", "--json")
        assert listed.returncode == 0, listed.stderr
        assert json.loads(listed.stdout) == ["demo%hello"]
        keys_only = dict(base, ORBIT_ACCESS_KEY=creds["access_key"], ORBIT_SECRET_KEY=creds["secret"])
        lost = orbit(keys_only, "topic", "list")
        assert lost.returncode == 2, lost.stdout + lost.stderr
        assert "operators only (tenant credential)" in lost.stderr
        assert "--control-plane" in lost.stderr
        found = orbit(dict(keys_only, ORBIT_CONTROL_PLANE=info["control_plane"]), "topic", "list")
        assert found.returncode == 0, found.stderr
        assert found.stdout.split() == ["demo%hello"]
        everything = orbit(operator, "topic", "list", "--json")
        assert everything.returncode == 0, everything.stderr
        assert {"demo%hello", "TBW102"} <= set(json.loads(everything.stdout))
        # The same credential logs in to the control plane (OAuth client credentials).
        import base64
        import urllib.parse
        import urllib.request

        basic = base64.b64encode(f"{creds['access_key']}:{creds['secret']}".encode()).decode()
        req = urllib.request.Request(
            info["control_plane"] + "/oauth/token",
            data=urllib.parse.urlencode({"grant_type": "client_credentials"}).encode(),
            headers={"Authorization": f"Basic {basic}"},
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            assert json.loads(resp.read())["token_type"] == "Bearer"
        # The web console, listed as console: its URL leads to the sign-in page.
        assert info["console"] == info["control_plane"] + "/console/"
        with urllib.request.urlopen(info["console"], timeout=10) as resp:
            assert resp.url.endswith("/console/sign-in")
            assert "Sign in to Orbit" in resp.read().decode()
        # The demo tenant signs in there with the credentials printed, as a browser does (the
        # form's CSRF token, the session cookie), and lands on its topics.
        import http.cookiejar
        import re

        browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
        with browser.open(info["console"] + "sign-in", timeout=10) as resp:
            form = dict(re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)">', resp.read().decode()))
        assert set(form) == {"csrf", "next"}, form
        form.update(client_id=creds["access_key"], client_secret=creds["secret"])
        with browser.open(info["console"] + "sign-in", data=urllib.parse.urlencode(form).encode(), timeout=10) as resp:
            landed = resp.read().decode()
        assert "tenant demo" in landed, landed[:2000]
        assert ">hello<" in landed, landed[:2000]
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert "Demo tenant 'demo'" in out
    assert f"console       {info['console']}" in out
    assert creds["access_key"] in out
    assert "stopped." in out
    cp = urlparse(info["control_plane"])
    for addr in (info["namesrv"], info["brokers"]["broker-a"], info["grpc"], f"{cp.hostname}:{cp.port}"):
        _refused(addr)
    # No secret in any process log under the data directory.
    for log in (data / "run").glob("*.log"):
        assert creds["secret"] not in log.read_text(errors="replace"), log
