"""LocalObjectStore: moto's S3 server as a child process, reached by boto3 over real HTTP; its
outages (pause / resume, stop / start) and its end with its owner (data_plane/local_object_store.py)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from botocore.exceptions import ConnectTimeoutError, EndpointConnectionError, ReadTimeoutError

from data_plane.local_cluster import TIER_BUCKET, LocalCluster
from data_plane.local_object_store import LocalObjectStore
from tests.object_store_fixture import object_store_fixture, tier_bucket_fixture  # noqa: F401

pytestmark = pytest.mark.integration


def refuses_connections(port: int, timeout_s: float = 10.0) -> bool:
    """Poll 127.0.0.1:``port`` until nothing listens there (True) or ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        except ConnectionRefusedError:
            return True
        except (ConnectionResetError, TimeoutError):
            pass  # (the server going down while this connected)
        time.sleep(0.02)
    return False


def test_a_bucket_takes_an_object_and_gives_it_back_over_http(
    object_store: LocalObjectStore, tier_bucket: tuple[str, str]
) -> None:
    endpoint, bucket = tier_bucket
    assert endpoint.startswith("http://127.0.0.1:")
    assert endpoint == object_store.endpoint_url
    body = os.urandom(256 * 1024)
    client = object_store.client()
    client.put_object(Bucket=bucket, Key="DefaultCluster/00000000000000000000", Body=body)
    got = client.get_object(Bucket=bucket, Key="DefaultCluster/00000000000000000000")
    assert got["Body"].read() == body
    assert got["ContentLength"] == len(body)


def test_a_paused_store_times_out_and_answers_again_with_its_objects_after_resume(
    object_store: LocalObjectStore, tier_bucket: tuple[str, str]
) -> None:
    _, bucket = tier_bucket
    object_store.client().put_object(Bucket=bucket, Key="k", Body=b"kept")
    object_store.pause()
    with pytest.raises((ReadTimeoutError, ConnectTimeoutError)):
        object_store.client(timeout_s=0.3, attempts=1).get_object(Bucket=bucket, Key="k")
    object_store.resume()
    assert object_store.client().get_object(Bucket=bucket, Key="k")["Body"].read() == b"kept"


def test_a_stopped_store_refuses_connections_and_starts_again_empty_on_the_same_port(
    object_store: LocalObjectStore, tier_bucket: tuple[str, str]
) -> None:
    endpoint, bucket = tier_bucket
    object_store.client().put_object(Bucket=bucket, Key="k", Body=b"x")
    proc = object_store.proc
    object_store.stop()
    assert proc is not None
    assert proc.returncode == 0  # it shut down, it was not killed
    with pytest.raises(EndpointConnectionError):
        object_store.client(timeout_s=0.3, attempts=1).list_buckets()
    assert object_store.start() == endpoint
    assert object_store.client().list_buckets()["Buckets"] == []  # moto keeps nothing across a restart
    assert object_store.log_path.read_text().count("moto S3 server on") >= 2


def test_a_store_on_a_taken_port_fails_with_the_reason(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        store = LocalObjectStore(tmp_path / "s3.log", port=taken.getsockname()[1])
        with pytest.raises(RuntimeError, match=r"cannot listen.*in use"):
            store.start()
    assert not store.running


def test_the_server_ends_with_the_process_that_started_it(tmp_path: Path) -> None:
    owner = textwrap.dedent(f"""
        import os, sys
        from data_plane.local_object_store import LocalObjectStore
        store = LocalObjectStore({str(tmp_path / "s3.log")!r})
        store.start()
        print(store.port, flush=True)
        sys.stdin.read()
    """)
    with subprocess.Popen([sys.executable, "-c", owner], stdin=subprocess.PIPE, stdout=subprocess.PIPE) as proc:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
        proc.send_signal(signal.SIGKILL)  # no exit handlers run: only the closed pipe tells the server
    assert refuses_connections(port)


def test_a_child_given_the_environment_finds_the_credentials_through_the_aws_chain(
    object_store: LocalObjectStore, tier_bucket: tuple[str, str]
) -> None:
    endpoint, bucket = tier_bucket
    script = f"import boto3; print(boto3.client('s3', endpoint_url={endpoint!r}).list_buckets()['Buckets'])"
    # The caller's own AWS settings (a profile that does not exist here) are not passed on.
    env = object_store.environment({**os.environ, "AWS_PROFILE": "nobody", "AWS_SESSION_TOKEN": "stale"})
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert bucket in done.stdout


def test_a_tiered_cluster_starts_its_store_with_the_bucket_and_stops_it(tmp_path: Path) -> None:
    cluster = LocalCluster(str(tmp_path), tier=True)
    try:
        cluster.start_object_store()
        store = cluster.object_store
        assert store is not None
        assert store.running
        assert TIER_BUCKET in [b["Name"] for b in store.client().list_buckets()["Buckets"]]
        assert cluster.tier_url == f"s3://{TIER_BUCKET}/DefaultCluster"
        assert cluster.tier_settings["tier_endpoint_url"] == store.endpoint_url
        assert cluster.broker_env is not None
        assert cluster.broker_env["AWS_ACCESS_KEY_ID"] == "testing"
    finally:
        cluster.stop()
    assert refuses_connections(store.port)
    assert (tmp_path / "run" / "object-store.log").exists()
