"""The report: ratios to the machine's limits and to peers, and the files written from a result."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from loadtest import histogram as h
from loadtest import report

pytestmark = pytest.mark.unit


def _hist(*values_us: int) -> str:
    hist = h.new_hist()
    for v in values_us:
        h.record_us(hist, v)
    return h.encode_hist(hist)


def _case(target: str, *, pub: float, con: float, send_p99: float, e2e_p99: float) -> dict[str, Any]:
    row = {
        "t_s": 0, "published_msgs": 5, "consumed_msgs": 5, "errors": 0,
        "send_latency_ms": {"count": 1, "p50": 1.0, "p99": 2.0}, "e2e_latency_ms": {"count": 1, "p50": 1.0, "p99": 3.0},
    }  # fmt: skip
    return {
        "name": "steady", "target": target, "status": "ok", "durability": f"{target} durability",
        "settings": {"warmup_s": 1.0},
        "publish": {"msgs_per_s": pub, "mb_per_s": pub / 1000, "send_latency_ms": {"p50": 1.0, "p99": send_p99},
                    "send_latency_hist": _hist(1000, 2000)},
        "consume": {"msgs_per_s": con, "consumed": 10, "expected": 10, "e2e_latency_ms": {"p99": e2e_p99},
                    "e2e_latency_hist": _hist(1500, 3000)},
        "timeline": [row, {**row, "t_s": 1}],
    }  # fmt: skip


def doc() -> dict[str, Any]:
    return {
        "schema": "orbit-loadtest/1",
        "scenario": {"name": "steady", "description": "d"},
        "peers_unavailable": {"kafka": "not installable here"},
        "cases": [
            _case("orbit", pub=2000, con=1800, send_p99=4.0, e2e_p99=6.0),
            _case("nats", pub=1000, con=900, send_p99=8.0, e2e_p99=3.0),
            {
                "name": "steady",
                "target": "redis",
                "status": "not_run",
                "reason": "redis-server is not on PATH",
                "durability": "r",
            },
        ],
    }


def test_ratios_to_limits_and_to_each_peer_that_ran() -> None:
    d = report.finish(
        doc(),
        limits={"disk_seq_write": {"mb_per_s": 100.0}, "loopback_tcp": {"mb_per_s": 1000.0}},
        note="other tests running",
    )
    r = d["ratios"]["steady"]
    assert r["publish_share_of_disk_bandwidth"] == pytest.approx(2e6 / (100 * (1 << 20)), rel=1e-3)
    assert r["publish_share_of_loopback_tcp"] == pytest.approx(2e6 / 1e9, rel=1e-3)
    assert r["vs_nats"] == {"publish_msgs_per_s": 2.0, "consume_msgs_per_s": 2.0, "send_p99_ms": 0.5, "e2e_p99_ms": 2.0}
    assert "vs_redis" not in r  # it did not run
    assert d["machine"]["note"] == "other tests running"


def test_without_limits_the_shares_are_null() -> None:
    r = report.finish(doc(), limits=None, note="")["ratios"]["steady"]
    assert r["publish_share_of_disk_bandwidth"] is None
    assert r["publish_share_of_loopback_tcp"] is None


def test_the_files_written_from_a_result(tmp_path: Path) -> None:
    d = report.finish(doc(), limits=None, note="")
    files = report.write(d, str(tmp_path))
    assert json.loads(Path(files["json"]).read_text()) == d
    pngs = sorted(p.name for p in tmp_path.glob("*.png"))
    assert pngs == ["steady-latency-distribution.png", "steady-latency-time.png", "steady-throughput.png"]
    page = Path(files["html"]).read_text()
    assert page.count("data:image/png;base64,") == 3
    assert "not installable here" in page
    assert "redis-server is not on PATH" in page
    assert "nats durability" in page
    text = report.summary_text(d)
    assert "not run: redis-server is not on PATH" in text
    assert "(10/10)" in text


def test_without_plots_the_page_is_written_all_the_same(tmp_path: Path) -> None:
    files = report.write(report.finish(doc(), limits=None, note=""), str(tmp_path), plots=False)
    assert not list(tmp_path.glob("*.png"))
    assert "<table>" in Path(files["html"]).read_text()
