"""``format("orbit")`` against a tenancy-enabled cluster (control plane + authenticating broker):
OAuth client credentials as options for read and write, a wrong secret failing fast with a clear
error, and the secret never in the plan string or in what Spark and its workers print."""

from __future__ import annotations

import time

import pytest

from sdk import Message, Producer
from tests.integration.spark_support import (
    SparkHandle,
    off_loop,
    spark_fixture,  # noqa: F401
)
from tests.integration.tenancy_cluster import TenancyCluster, tenancy_fixture  # noqa: F401
from tests.postgres_fixture import postgres_dsn_fixture, postgres_server_fixture  # noqa: F401

pytestmark = [pytest.mark.integration, pytest.mark.asyncio, pytest.mark.timeout(300)]

FAIL_FAST_S = 20.0  # a refused credential fails the action within this long (no task retries)


async def test_credentials_read_write_and_redaction(
    spark: SparkHandle, tenancy: TenancyCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    acme = await tenancy.new_tenant("acme")
    await tenancy.create_topic(acme, "orders")
    await tenancy.create_group(acme, "orbit-spark-reader")
    topic = "acme%orders"
    token_url = tenancy.cp.url + "/oauth/token"
    async with Producer("acme%seed", namesrv_addrs=tenancy.namesrv.address, credentials=acme.credentials(tenancy)) as p:
        for i in range(10):
            await p.send(Message(topic, f"m{i}".encode(), keys=f"k{i}"))

    good = {
        "namesrv": tenancy.namesrv.address,
        "topic": topic,
        "clientId": acme.access_key,
        "clientSecret": acme.secret,
        "tokenUrl": token_url,
    }
    session = spark.session
    session.sparkContext.setLogLevel("INFO")  # the most Spark would ever print about the job
    try:
        df = session.read.format("orbit").options(**good).load()
        rows = await off_loop(spark, df.collect)
        assert sorted(bytes(r.body) for r in rows) == sorted(f"m{i}".encode() for i in range(10))
        assert {r.topic for r in rows} == {topic}

        capsys.readouterr()
        await off_loop(spark, lambda: df.explain(True))
        await off_loop(spark, lambda: df.explain("formatted"))
        plan = capsys.readouterr().out
        assert "orbit" in plan.lower()  # explain printed the scan
        assert acme.secret not in plan

        # Write with the same credentials, read back.
        out = session.createDataFrame([(f"w{i}",) for i in range(5)], "body string")
        await off_loop(spark, lambda: out.write.format("orbit").options(**good).mode("append").save())
        again = await off_loop(spark, lambda: session.read.format("orbit").options(**good).load().count())
        assert again == 15

        # A wrong secret: the read and the write fail fast, saying why, without the secret.
        wrong = {**good, "clientSecret": "not-the-secret-" + acme.secret[::-1]}
        for action in (
            lambda: session.read.format("orbit").options(**wrong).load().collect(),
            lambda: out.write.format("orbit").options(**wrong).mode("append").save(),
        ):
            started = time.monotonic()
            with pytest.raises(Exception, match="Orbit refused the credentials") as info:
                await off_loop(spark, action)
            assert time.monotonic() - started < FAIL_FAST_S
            text = str(info.value)
            assert acme.access_key in text  # who was refused
            assert wrong["clientSecret"] not in text
            assert acme.secret not in text
    finally:
        session.sparkContext.setLogLevel("WARN")
    logs = spark.log_text()
    assert " INFO " in logs  # the log file did get Spark's output
    assert "AuthenticationError" in logs  # and what the Python workers printed about the refusal
    assert acme.secret not in logs
    assert acme.secret[::-1] not in logs


async def test_a_writer_over_its_tenants_publish_quota_waits_instead_of_failing(
    spark: SparkHandle, tenancy: TenancyCluster
) -> None:
    # A real broker quota: 100 msgs/s for acme. 400 rows take ~4 s of throttling and all land;
    # with the quota at 0 (every send refused) and a short throttleTimeoutMs the job fails saying why.
    acme = await tenancy.new_tenant("acme")
    reply = await tenancy.cp.call("PUT", "/v1/tenants/acme/quota", operator=True, json={"publish_msgs_per_s": 100})
    assert reply.status == 200, reply.body
    await tenancy.create_topic(acme, "orders")
    await tenancy.create_group(acme, "orbit-spark-reader")
    await tenancy.reconciled()
    opts = {
        "namesrv": tenancy.namesrv.address,
        "topic": "acme%orders",
        "clientId": acme.access_key,
        "clientSecret": acme.secret,
        "tokenUrl": tenancy.cp.url + "/oauth/token",
        "batchSize": "20",
    }
    session = spark.session
    rows = session.createDataFrame([(f"q{i}",) for i in range(400)], "body string").repartition(2)
    started = time.monotonic()
    await off_loop(spark, lambda: rows.write.format("orbit").options(**opts).mode("append").save())
    took = time.monotonic() - started
    read_opts = {k: v for k, v in opts.items() if k != "batchSize"}
    stored = await off_loop(spark, lambda: session.read.format("orbit").options(**read_opts).load().collect())
    assert sorted(bytes(r.body) for r in stored) == sorted(f"q{i}".encode() for i in range(400))
    assert took >= 2.0, f"400 messages at 100 msgs/s (after a 1 s burst) took only {took:.1f} s: not throttled?"

    reply = await tenancy.cp.call("PUT", "/v1/tenants/acme/quota", operator=True, json={"publish_msgs_per_s": 0})
    assert reply.status == 200, reply.body
    await tenancy.reconciled()
    blocked = session.createDataFrame([("never",)], "body string")
    short = {**opts, "throttleTimeoutMs": "1500"}
    with pytest.raises(Exception, match="throttl") as failed:
        await off_loop(spark, lambda: blocked.write.format("orbit").options(**short).mode("append").save())
    assert acme.secret not in str(failed.value)
