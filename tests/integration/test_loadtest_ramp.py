"""``orbit loadtest`` on a tiny elastic ramp, as a user runs it: two broker groups and the control
plane with its autoscaler (one queue "sustains" 20 msgs/s here), one tenant's topic made with a
1,000 msgs/s hint (4 queues), and an open-loop load from 40 to 160 msgs/s, held, then falling to
10 msgs/s.

Asserted: the topic's writable queues grew past the minimum and came back to it, readable ones
too (drained, then removed), with the autoscaler's scaling events; the per-10 s report covers the
run; the plot is an SVG; every acknowledged message was delivered (0 lost). Latencies are not
judged.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.test_loadtest_cli import STORE_SET

pytestmark = [pytest.mark.integration]

REPO = Path(__file__).resolve().parents[2]
SCENARIO = f"""
name = "tiny-ramp"
warmup_s = 2
duration_s = 30
producers = 1
consumers = 1
rate_msgs_per_s = 40
message_bytes = 200
drain_timeout_s = 20
ramp = {{ to = 160, over_s = 4, hold_s = 6, fall_to = 10, fall_s = 20 }}

[autoscale]
broker_groups = 2
interval_s = 0.5
queue_capacity_msgs_per_s = 20
window_s = 2
down_after_s = 3
load_report_interval_s = 0.5
route_refresh_ms = 500
sample_s = 0.5

{STORE_SET}"""


def test_a_tiny_ramp_grows_the_topic_then_brings_it_back_to_its_minimum_losing_nothing(tmp_path: Path) -> None:
    scenario = tmp_path / "tiny-ramp.toml"
    scenario.write_text(SCENARIO)
    out = tmp_path / "out"
    args = ["--scenario", str(scenario), "--out", str(out), "--no-limits", "--progress", "off", "--seed", "7"]
    run = subprocess.run(
        [sys.executable, "-m", "data_plane.cli", "loadtest", *args],
        capture_output=True, text=True, cwd=REPO, timeout=180, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    case = json.loads((out / "result.json").read_text())["cases"][0]
    assert case["status"] == "ok"
    el = case["elastic"]
    verdicts = el["verdicts"]

    writable = [q["writable"] for q in el["queues"]]
    assert writable[0] == 4, writable
    assert max(writable) > 4, writable
    assert verdicts["queues_grow"]["spells"], verdicts["queues_grow"]
    assert verdicts["queues_grow"]["met"], verdicts["queues_grow"]
    back = verdicts["back_to_minimum"]
    assert back["minimum"] == 4
    assert back["grew"], back
    assert back["met"], back
    assert (el["queues"][-1]["writable"], el["queues"][-1]["readable"]) == (4, 4)
    actions = [e["action"] for e in el["scaling_events"]]
    assert {"grow", "shrink", "remove"} <= set(actions), actions

    windows = el["windows"]
    assert [w["from_s"] for w in windows] == [0, 10, 20, 30]
    assert windows[0]["offered_msgs_per_s"] > windows[-1]["offered_msgs_per_s"] == 10
    for w in windows:
        assert {"p50", "p99", "count"} <= set(w["send_latency_ms"])
        assert "p99" in w["e2e_latency_ms"]
        assert w["writable_queues"] is not None

    delivery = case["delivery"]
    assert delivery["acknowledged"] == case["publish"]["acked"] > 0
    assert delivery["lost"] == 0, delivery
    assert verdicts["lost"]["met"]
    assert el["tenant_api_calls_during_run"] == 0

    svg = (out / "tiny-ramp-elastic.svg").read_text()
    assert svg.lstrip().startswith("<?xml")
    assert "<svg" in svg
