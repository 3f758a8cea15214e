"""``orbit loadtest`` run as a user runs it, for a few seconds, against a local cluster it starts
itself: a small open-loop scenario, then ``orbit loadtest merge`` over its result.

Asserted: the counts the scenario fixes (every scheduled message acknowledged, every
acknowledged message consumed), the JSON's schema and figures, PNG files that are PNGs, an HTML
page with the plots inlined, the machine limits, and that no secret reaches the output. Nothing
is timed: the figures' sizes are not judged.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from loadtest.rate import RateProfile

pytestmark = [pytest.mark.integration, pytest.mark.timing]

REPO = Path(__file__).resolve().parents[2]
# Small store files; no DISK_FULL refusals on the shared test disk (scenarios of the other loadtest tests too).
STORE_SET = """[store_set]
commit_log_file_size_bytes = 16777216
reserve_ahead_bytes = 0
index_hash_slots = 65536
index_max_entries = 262144
disk_max_used_space_ratio = 0.99
disk_space_clean_forcibly_ratio = 1.0
disk_space_warning_level_ratio = 1.0
"""
RATE = 300  # msgs/s
WARMUP_S = 0.5
DURATION_S = 2.0
PRODUCERS = 2
SCENARIO = f"""
name = "tiny"
description = "integration test"
duration_s = {DURATION_S}
warmup_s = {WARMUP_S}
producers = {PRODUCERS}
consumers = 1
rate_msgs_per_s = {RATE}
message_bytes = [100, 300]
queues = 4
drain_timeout_s = 30

{STORE_SET}"""


def run(*args: str, timeout_s: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "data_plane.cli", "loadtest", *args],
        capture_output=True, text=True, cwd=REPO, timeout=timeout_s, check=False,
    )  # fmt: skip


def scheduled_messages() -> int:
    """What the open-loop schedule holds: each producer's share over warm-up + duration."""
    share = RateProfile.steady(msgs_per_s=RATE / PRODUCERS, duration_s=WARMUP_S + DURATION_S)
    return PRODUCERS * share.count()


def check_case(case: dict[str, Any]) -> None:
    assert case["status"] == "ok", case.get("reason")
    assert (case["name"], case["target"]) == ("tiny", "orbit")
    assert "ASYNC_FLUSH" in case["durability"]
    pub, con = case["publish"], case["consume"]
    assert pub["errors"] == 0, pub["errors_by_kind"]
    assert pub["dropped_behind_schedule"] == 0
    assert pub["acked"] == scheduled_messages()
    assert 0 < pub["acked_measured"] < pub["acked"]  # the warm-up is not measured
    assert pub["send_latency_ms"]["count"] == pub["acked_measured"]
    assert pub["generator_lag_ms"]["count"] == pub["acked_measured"]  # one send per message (batch 1)
    assert con["expected"] == pub["acked"]
    assert con["consumed"] == pub["acked"], "every acknowledged message is consumed"
    assert con["per_group"] == {"lt-group-0": pub["acked"]}
    assert con["e2e_latency_ms"]["count"] > 0
    for what in (pub["send_latency_ms"], con["e2e_latency_ms"]):
        assert 0 < what["p50"] <= what["p99"] <= what["max"]
    cost = case["broker_cost"]  # what the case cost the broker: sampled around the load
    assert cost["cpu_s"] > 0
    assert cost["quota_refusals"] == cost["quota_early_refusals"] == 0  # no tenants, no quotas
    rows = case["timeline"]
    assert sum(r["published_msgs"] for r in rows) == pub["acked"]
    assert sum(r["consumed_msgs"] for r in rows) == con["consumed"]
    assert sum(r["send_latency_ms"]["count"] for r in rows) == pub["acked_measured"]


def test_orbit_loadtest_runs_a_scenario_and_writes_json_plots_and_html(tmp_path: Path) -> None:
    scenario = tmp_path / "tiny.toml"
    scenario.write_text(SCENARIO)
    out = tmp_path / "out"
    proc = run(
        "--scenario", str(scenario), "--out", str(out), "--data-dir", str(tmp_path / "data"),
        "--disk-mb", "8", "--seed", "7", "--note", "integration test",
    )  # fmt: skip
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr[-4000:]}"
    assert "\r" not in proc.stderr, "no progress line when stderr is not a terminal"
    doc = json.loads((out / "result.json").read_text())
    assert doc["schema"] == "orbit-loadtest/1"
    assert doc["scenario"]["name"] == "tiny"
    assert doc["seed"] == 7
    assert doc["machine"]["note"] == "integration test"
    limits = doc["machine_limits"]
    assert limits["disk_seq_write"]["megabytes"] == 8
    assert limits["disk_seq_write"]["mb_per_s"] > 0
    assert limits["loopback_tcp"]["mb_per_s"] > 0
    (case,) = doc["cases"]
    check_case(case)
    assert doc["ratios"]["tiny"]["publish_share_of_disk_bandwidth"] > 0
    assert doc["ratios"]["tiny"]["publish_share_of_loopback_tcp"] > 0

    pngs = sorted(p.name for p in out.glob("*.png"))
    assert pngs == ["tiny-latency-distribution.png", "tiny-latency-time.png", "tiny-throughput.png"]
    for p in pngs:
        assert (out / p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", p
    page = (out / "report.html").read_text()
    assert page.count('src="data:image/png;base64,') == 3
    assert "Orbit load test: tiny" in page
    assert "tiny" in proc.stdout
    assert "report.html" in proc.stdout

    # Two generators' results (here: the same one twice) merge into one with every count doubled.
    merged = tmp_path / "merged"
    m = run("merge", str(out / "result.json"), str(out / "result.json"), "--out", str(merged))
    assert m.returncode == 0, m.stderr
    mdoc = json.loads((merged / "result.json").read_text())
    (mcase,) = mdoc["cases"]
    assert mcase["publish"]["acked"] == 2 * case["publish"]["acked"]
    assert mcase["consume"]["consumed"] == 2 * case["consume"]["consumed"]
    assert mcase["publish"]["send_latency_ms"]["count"] == 2 * case["publish"]["send_latency_ms"]["count"]
    assert (merged / "report.html").exists()


def test_orbit_loadtest_refuses_a_bad_scenario_naming_the_field(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("producers = 1000\n")
    proc = run("--scenario", str(bad), "--out", str(tmp_path / "out"), timeout_s=60)
    assert proc.returncode == 2
    assert f"{bad}: producers: 1000 is outside 0 .. 64" in proc.stderr
    assert not (tmp_path / "out").exists()
    listed = run("--list", timeout_s=60)
    assert listed.returncode == 0
    assert "noisy-neighbour" in listed.stdout
    assert "steady" in listed.stdout
