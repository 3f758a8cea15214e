"""The Spark data source's option parsing, credentials (never shown) and the writer's
back-off when throttled — without Spark or a cluster."""

from __future__ import annotations

import pickle
import ssl
from pathlib import Path

import pytest

from data_plane.tls import make_local_ca
from spark_integration.credentials import Secret, credentials_from, options_from_conf
from spark_integration.errors import OrbitSparkError
from spark_integration.options import EARLIEST, LATEST, ReadOptions, WriteOptions

NS = {"namesrv": "127.0.0.1:9876"}


def test_read_options_defaults_and_offsets() -> None:
    o = ReadOptions.parse({**NS, "topic": "a", "startingOffsets": '{"a": {"b:0": 5, "b:1": -2}}'}, env={})
    assert o.namesrv == ("127.0.0.1:9876",)
    assert o.topics == ("a",)
    assert o.starting.for_queue("a", "b", 0) == 5
    assert o.starting.for_queue("a", "b", 1) == EARLIEST
    assert o.starting.for_queue("a", "b", 2) == EARLIEST  # not named: the default
    assert o.ending.for_queue("a", "b", 0) == LATEST
    assert o.credentials.kind == "none"
    t = ReadOptions.parse({**NS, "TOPICS": "a, b", "startingTimestamp": "1700000000000"}, env={})
    assert t.topics == ("a", "b")
    assert t.starting.kind == "timestamp"
    assert t.starting.timestamp_ms == 1_700_000_000_000


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"topic": "a"}, "option namesrv is required"),
        ({**NS}, "exactly one of the options topic"),
        ({**NS, "topic": "a", "topicPattern": "x"}, "exactly one of the options topic"),
        ({**NS, "topicPattern": "("}, "not a regular expression"),
        ({**NS, "topic": "a", "startingOffsets": "first"}, "startingOffsets must be"),
        ({**NS, "topic": "a", "endingOffsets": '{"a": {"b0": 1}}'}, "is not 'broker:queueId'"),
        ({**NS, "topic": "a", "endingOffsets": '{"a": {"b:0": -3}}'}, "must be an offset"),
        ({**NS, "topic": "a", "maxRecordsPerPartition": "0"}, "must be >= 1"),
        ({**NS, "topic": "a", "startingTimestamp": "1", "startingOffsets": "latest"}, "not both"),
        ({**NS, "topic": "a", "colour": "blue"}, "unknown read option"),
        ({**NS, "topic": "a", "clientId": "c"}, "missing: clientSecret, tokenUrl"),
        ({**NS, "topic": "a", "accessKey": "ak"}, "both accessKey and secretKey"),
    ],
)
def test_read_option_errors(options: dict[str, str], message: str) -> None:
    with pytest.raises(OrbitSparkError, match=message):
        ReadOptions.parse(options, env={})


def test_credentials_from_options_then_env_never_shown() -> None:
    env = {"ORBIT_CLIENT_ID": "env-id", "ORBIT_CLIENT_SECRET": "env-s3cret", "ORBIT_TOKEN_URL": "http://cp/oauth/token"}
    spec = credentials_from({}, env)
    assert (spec.kind, spec.client_id) == ("client", "env-id")
    opts = {"clientid": "opt-id", "clientsecret": "opt-s3cret", "tokenurl": "https://cp/oauth/token"}
    spec = credentials_from(opts, env)
    assert (spec.kind, spec.client_id, spec.token_url) == ("client", "opt-id", "https://cp/oauth/token")
    assert spec.secret is not None
    assert spec.secret.reveal() == "opt-s3cret"
    o = ReadOptions.parse({**NS, "topic": "a", **opts}, env={})
    for shown in (repr(o), str(o), repr(o.credentials), o.credentials.describe()):
        assert "opt-s3cret" not in shown
    assert pickle.loads(pickle.dumps(o)) == o  # shipped to executors as it is
    ak = credentials_from({"accesskey": "AK", "secretkey": "SK-s3cret"}, {})
    assert ak.kind == "access_key"
    assert "SK-s3cret" not in repr(ak)
    assert credentials_from({}, {"ORBIT_TOKEN": "tok"}).kind == "token"
    assert repr(Secret("x")) == str(Secret("x")) == "<redacted>"
    conf = {"spark.orbit.clientId": "i", "spark.orbit.clientSecret": "s", "spark.app.name": "n"}
    assert options_from_conf(conf) == {"clientId": "i", "clientSecret": "s"}


def test_write_options() -> None:
    w = WriteOptions.parse({**NS, "topic": "acme%orders", "batchSize": "10"}, env={})
    assert w.producer_group == "acme%orbit-spark-writer"
    assert w.batch_size == 10
    with pytest.raises(OrbitSparkError, match="unknown write option"):
        WriteOptions.parse({**NS, "startingOffsets": "earliest"}, env={})


def test_tls_options_travel_with_the_credentials_and_make_a_verifying_context(tmp_path: Path) -> None:
    files = make_local_ca(str(tmp_path / "ca"))
    opts = ReadOptions.parse({"namesrv": "h:9876", "topic": "t", "tlsCaFile": files["ca.pem"]})
    spec = pickle.loads(pickle.dumps(opts.credentials))  # as executors get it
    assert spec.tls_ca_file == files["ca.pem"]
    ctx = spec.tls_context()
    assert ctx is not None
    assert ctx.verify_mode == ssl.CERT_REQUIRED
    assert ctx.check_hostname
    assert credentials_from({"tls": "true"}, env={}).tls_context() is not None
    assert credentials_from({}, env={}).tls_context() is None  # the SDK's default: the environment
    with pytest.raises(OrbitSparkError, match="tls must be true or false"):
        credentials_from({"tls": "maybe"}, env={})
    with pytest.raises(OrbitSparkError, match=r"tlsCaFile .* is not a readable file"):
        credentials_from({"tlscafile": str(tmp_path / "missing.pem")}, env={})
