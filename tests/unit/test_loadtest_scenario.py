"""The scenario parser: shipped files, a file with variants, flags over a file, and bad files —
each refused with a message naming the field."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest

from loadtest import scenario as sc

pytestmark = pytest.mark.unit


def test_every_shipped_scenario_parses_and_is_listed() -> None:
    names = [n for n, _ in sc.shipped()]
    assert {"steady", "burst", "backlog", "many-queues", "fan-out", "ordered", "flush", "replication",
            "noisy-neighbour"} <= set(names)  # fmt: skip
    for name in names:
        s = sc.load(name)
        assert s.name == name
        assert s.cases, name


def test_a_file_with_variants_gives_one_case_per_variant_over_the_base(tmp_path: Path) -> None:
    f = tmp_path / "s.toml"
    f.write_text(
        """
name = "mine"
duration_s = 5
producers = 3
message_bytes = [100, 2000]
rate_msgs_per_s = 800
peers = ["redis"]
store_set = { reserve_ahead_bytes = 0, check = true }
broker_set = { fair_share = false }
[burst]
at_s = 1
duration_s = 2
factor = 10
[[variants]]
name = "a"
queues = 16
[[variants]]
name = "b"
queues = 10000
producers = 1
"""
    )
    s = sc.load(f)
    assert s.peers == ("redis",)
    a, b = s.cases
    assert (a.name, a.queues, a.producers) == ("a", 16, 3)
    assert (b.name, b.queues, b.producers) == ("b", 10000, 1)
    for c in s.cases:
        assert c.message_bytes == (100, 2000)
        assert c.duration_s == 5.0
        assert c.burst == sc.Burst(at_s=1.0, duration_s=2.0, factor=10.0)
        assert c.store_set == (("check", "true"), ("reserve_ahead_bytes", "0"))
        assert c.broker_set == (("fair_share", "false"),)
        assert c.open_loop


def test_flags_override_the_file_in_every_case() -> None:
    s = sc.load("many-queues", overrides={"duration_s": 2, "rate_msgs_per_s": 100, "message_bytes": [64, 64]})
    assert [c.topics * c.queues for c in s.cases] == [16, 10000]
    assert all(c.duration_s == 2.0 and c.rate_msgs_per_s == 100.0 and c.message_bytes == (64, 64) for c in s.cases)


def test_no_file_at_all_is_a_case_of_defaults_and_flags() -> None:
    s = sc.parse({}, overrides={"producers": 2})
    (c,) = s.cases
    assert c.producers == 2
    assert not c.open_loop  # no rate: closed loop, as fast as it goes


@pytest.mark.parametrize(
    ("doc", "field", "why"),
    [
        ({"producer": 2}, "producer", "unknown field"),
        ({"producers": "2"}, "producers", "whole number"),
        ({"producers": 2.5}, "producers", "whole number"),
        ({"producers": 65}, "producers", "outside"),
        ({"ordered": 1}, "ordered", "true or false"),
        ({"flush": "SOMETIMES"}, "flush", "ASYNC_FLUSH"),
        ({"message_bytes": 8}, "message_bytes", "outside"),
        ({"message_bytes": [2000, 100]}, "message_bytes", "larger than max"),
        ({"message_bytes": [1, 2, 3]}, "message_bytes", "[min, max]"),
        ({"duration_s": 0}, "duration_s", "outside"),
        ({"peers": ["kafka"]}, "peers", "nats, redis"),
        ({"burst": {"at_s": 1, "duration_s": 2, "factor": 10}}, "burst", "needs a target rate"),
        ({"burst": {"at_s": 1, "factor": 10}, "rate_msgs_per_s": 5}, "burst.duration_s", "missing"),
        ({"burst": {"at_s": 1, "duration_s": 1, "factor": 2, "x": 1}, "rate_msgs_per_s": 5}, "burst.x", "unknown"),
        ({"ordered": True, "batch": 4}, "ordered", "batch = 1"),
        ({"broker_role": "SYNC_MASTER"}, "slaves", "set slaves = 1"),
        ({"flush": "SYNC_FLUSH", "peers": ["nats"]}, "peers", "Orbit's"),
        ({"producers": 0, "consumers": 0}, "producers", "needs producers or consumers"),
        ({"topics": 20, "queues": 10000}, "queues", "100,000"),
        ({"consumers": 0, "consumers_start_after_msgs": 5}, "consumers_start_after_msgs", "needs consumers"),
        (
            {
                "tenants": {"count": 2, "publish_quota_msgs_per_s": 5, "noisy_rate_msgs_per_s": 9},
                "rate_msgs_per_s": 5,
                "producers": 2,
                "peers": ["redis"],
            },
            "tenants",
            "peers have no tenants",
        ),
        (
            {
                "tenants": {"count": 3, "publish_quota_msgs_per_s": 5, "noisy_rate_msgs_per_s": 9},
                "rate_msgs_per_s": 5,
                "producers": 2,
            },
            "producers",
            "one producer process per tenant",
        ),
        ({"variants": [{"name": "a"}, {"name": "a"}]}, "variants[1].name", "appears twice"),
        ({"variants": [{"queues": 4}]}, "variants[0].name", "expected a name"),
        ({"variants": [{"name": "a", "peers": []}]}, "variants[0].peers", "top of the file"),
        ({"variants": [{"name": "a", "queues": 0}]}, "variants[0].queues", "outside"),
        ({"store_set": {"a": [1]}}, "store_set", "broker store settings"),
        ({"broker_set": {"a": {"b": 1}}}, "broker_set", "a table of broker settings"),
    ],
)
def test_a_bad_field_is_refused_naming_it(doc: dict[str, Any], field: str, why: str) -> None:
    with pytest.raises(sc.ScenarioError) as e:
        sc.parse(doc, source="bad.toml")
    assert str(e.value).startswith("bad.toml"), e.value
    assert field in str(e.value), e.value
    assert why in str(e.value), e.value


def test_a_bad_flag_is_refused_naming_the_flag() -> None:
    with pytest.raises(sc.ScenarioError, match=r"--producers: 100 is outside"):
        sc.parse({}, overrides={"producers": 100})


def test_files_that_are_not_scenarios(tmp_path: Path) -> None:
    broken = tmp_path / "broken.toml"
    broken.write_text("name = [unterminated\n")
    with pytest.raises(sc.ScenarioError, match="not valid TOML"):
        sc.load(broken)
    with pytest.raises(sc.ScenarioError, match="no such file, and not a shipped scenario"):
        sc.load(tmp_path / "missing.toml")
    big = tmp_path / "big.toml"
    big.write_text("# " + "x" * sc.MAX_FILE_BYTES + "\n")
    with pytest.raises(sc.ScenarioError, match="small file"):
        sc.load(big)


def test_the_shipped_files_say_what_they_promise() -> None:
    """The issue's scenario list, as data: burst is 10x for 10 s, fan-out has 8 groups, the
    many-queues case goes from 16 to 10,000, flush and replication compare both modes."""
    burst = sc.load("burst").cases[0]
    assert burst.burst is not None
    assert (burst.burst.factor, burst.burst.duration_s) == (10.0, 10.0)
    assert sc.load("fan-out").cases[0].consumer_groups == 8
    assert [c.topics * c.queues for c in sc.load("many-queues").cases] == [16, 10000]
    assert {c.flush for c in sc.load("flush").cases} == {"ASYNC_FLUSH", "SYNC_FLUSH"}
    assert {c.broker_role for c in sc.load("replication").cases} == {"ASYNC_MASTER", "SYNC_MASTER"}
    baseline, *floods = sc.load("noisy-neighbour").cases
    assert baseline.tenants is not None
    assert baseline.tenants.noisy_rate_msgs_per_s <= baseline.tenants.publish_quota_msgs_per_s
    factors = []
    for noisy in floods:
        assert noisy.tenants is not None
        assert noisy.tenants.noisy_nice == baseline.tenants.noisy_nice  # the same machine, only the rate differs
        factors.append(noisy.tenants.noisy_rate_msgs_per_s / noisy.tenants.publish_quota_msgs_per_s)
    named = {c.name: c.tenants for c in floods}
    own_quota = {n: t.noisy_publish_quota_msgs_per_s or t.publish_quota_msgs_per_s for n, t in named.items() if t}
    assert {n: t.noisy_rate_msgs_per_s / own_quota[n] for n, t in named.items() if t} == {
        "at-quota": 0.97,  # what a flood gets acknowledged, no more
        "cpu-neighbour": 0.5,
        "noisy-4x": 4.0,
        "noisy-20x": 20.0,
        "connection-storm": 4.0,
        "backlog-drain": 0.5,
        "burst-in-quota": 0.06,  # far within its own quota, far past what the broker can do
    }
    assert len(factors) == len(named)
    assert [n for n, t in named.items() if t and t.noisy_cpu_burn] == ["cpu-neighbour"]  # the control
    storm = named["connection-storm"]
    assert storm is not None
    assert storm.noisy_connections == 500
    drain = named["backlog-drain"]  # the noisy tenant drains a backlog instead of flooding
    assert drain is not None
    assert drain.noisy_backlog_msgs == 1_000_000
    assert drain.noisy_consume_quota_msgs_per_s > 0
    assert sc.load("backlog").cases[0].consumers_start_after_msgs > 0
    assert sc.load("ordered").cases[0].ordered
    assert set(sc.load("steady").peers) == {"nats", "redis"}
    raw = tomllib.loads((sc.SHIPPED_DIR / "steady.toml").read_text())
    assert raw["name"] == "steady"


def test_the_backlog_tenant_stores_its_backlog_unthrottled_and_drains_it_at_its_consume_quota() -> None:
    from loadtest.targets import BACKLOG_PUBLISH_QUOTA, _quota

    cases = {c.name: c for c in sc.load("noisy-neighbour").cases}
    drain = cases["backlog-drain"].tenants
    assert drain is not None
    assert _quota(drain, noisy=True) == {
        "publish_msgs_per_s": BACKLOG_PUBLISH_QUOTA,
        "consume_msgs_per_s": drain.noisy_consume_quota_msgs_per_s,
    }
    assert _quota(drain, noisy=False) == {"publish_msgs_per_s": drain.publish_quota_msgs_per_s}
    flood = cases["noisy-4x"].tenants
    assert flood is not None
    assert _quota(flood, noisy=True) == {"publish_msgs_per_s": flood.publish_quota_msgs_per_s}


def test_the_bursting_tenant_gets_its_own_quota_and_the_others_keep_theirs() -> None:
    from loadtest.targets import _quota

    burst = {c.name: c for c in sc.load("noisy-neighbour").cases}["burst-in-quota"].tenants
    assert burst is not None
    assert burst.noisy_publish_quota_msgs_per_s > burst.noisy_rate_msgs_per_s  # the burst is within it
    assert _quota(burst, noisy=True) == {"publish_msgs_per_s": burst.noisy_publish_quota_msgs_per_s}
    assert _quota(burst, noisy=False) == {"publish_msgs_per_s": burst.publish_quota_msgs_per_s}


def test_a_noisy_tenant_of_its_own_cpu_has_every_client_there_and_nothing_else() -> None:
    import dataclasses
    import os

    from loadtest.cpu_split import split
    from loadtest.runner import _consumer_jobs, _producer_jobs

    @dataclasses.dataclass
    class _Tenant:  # what the runner reads of a provisioned tenant
        tenant: str
        spec: dict[str, Any]
        topics: list[str]
        groups: list[str]

    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 usable CPUs")
    case = {c.name: c for c in sc.load("noisy-neighbour").cases}["noisy-4x"]
    assert case.tenants is not None
    tenants = [_Tenant(f"t{i}", {}, [f"t{i}%topic"], [f"t{i}%group"]) for i in range(case.tenants.count)]
    noisy_cpu, others = split()
    assert noisy_cpu == (max(os.sched_getaffinity(0)),)
    assert not set(noisy_cpu) & set(others)
    assert set(noisy_cpu) | set(others) == os.sched_getaffinity(0)
    for want in ((), noisy_cpu):
        producers = _producer_jobs(case, {}, tenants, 7, want)
        consumers = _consumer_jobs(case, {}, tenants, want)
        assert {j.cpus for j in producers if j.tenant == "t0"} == {want}
        assert {j.cpus for j in consumers if j.tenant == "t0"} == {want}
        # The other tenants' clients are left where the run starts them: on the others' CPUs.
        assert {j.cpus for j in producers if j.tenant != "t0"} | {j.cpus for j in consumers if j.tenant != "t0"} == {()}


def test_the_rest_of_a_run_goes_to_the_other_cpus_and_comes_back() -> None:
    import os

    from loadtest.cpu_split import CpuSplitError, others_on, split

    before = os.sched_getaffinity(0)
    if len(before) < 2:
        with pytest.raises(CpuSplitError, match="2 usable CPUs"):
            split()
        return
    _noisy, others = split()
    with others_on(others):
        assert os.sched_getaffinity(0) == set(others)
    assert os.sched_getaffinity(0) == before
