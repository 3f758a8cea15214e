"""``orbit bench store`` and ``orbit bench e2e``, run as a user runs them: a process, its JSON
on stdout, the --out file.

The issue asks for these figures; each must be there and be a positive number. Their sizes are
not judged (a benchmark is not a timed test); where a figure is a count the flags fix, the count
is checked exactly.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from loadtest.verdict import brief, targets, verdict

pytestmark = [pytest.mark.integration, pytest.mark.timing]

REPO = Path(__file__).resolve().parents[2]
MESSAGES = 2000
QUEUE_MESSAGES = 2000
RSS_GB = 0.01
DISK_MB = 8
REPEATS = 2


def positive(value: Any, what: str) -> float:
    assert isinstance(value, int | float), f"{what} is {value!r}, not a number"
    assert not isinstance(value, bool), f"{what} is {value!r}, not a number"
    assert math.isfinite(value), f"{what} is {value!r}"
    assert value > 0, f"{what} is {value!r}, not positive"
    return float(value)


def figure(result: dict[str, Any], path: str) -> Any:
    node: Any = result
    for part in path.split("."):
        assert isinstance(node, dict), f"{path}: {part!r} is under a {type(node).__name__}"
        assert part in node, f"{path} is missing (have {sorted(node)})"
        node = node[part]
    return node


def check_figures(result: dict[str, Any]) -> None:
    for path in (
        "disk_seq_write.mb_per_s",
        "page_cache_write.mb_per_s",
        "page_cache_write.last_quarter_mb_per_s",
        "append_single.msgs_per_s",
        "append_single.mb_per_s",
        "append_batch32.msgs_per_s",
        "read_sequential.msgs_per_s",
        "sync_flush_64_writers.msgs_per_s",
        "queues_16.msgs_per_s",
        "queues_10000.msgs_per_s",
        "ratio_to_disk.append_single",
        "ratio_to_disk.append_batch32",
        "ratio_to_page_cache.append_single",
        "ratio_to_page_cache.append_batch32",
    ):
        positive(figure(result, path), path)
    # The flags fix these counts.
    assert figure(result, "disk_seq_write.megabytes") == DISK_MB
    assert figure(result, "page_cache_write.megabytes") == 4 * DISK_MB
    assert figure(result, "append_single.msgs") == MESSAGES
    assert figure(result, "append_batch32.msgs") == MESSAGES // 32 * 32
    # Every message appended above (in every repeat) is read back.
    assert figure(result, "read_sequential.msgs") == REPEATS * (MESSAGES + MESSAGES // 32 * 32)
    # Each figure is the median of REPEATS runs, all of them kept.
    for name in ("append_single", "append_batch32", "read_sequential", "sync_flush_64_writers", "queues_16"):
        runs = figure(result, f"{name}.runs_msgs_per_s")
        assert len(runs) == REPEATS, f"{name}: {runs}"
        assert figure(result, f"{name}.msgs_per_s") in runs
    assert figure(result, "queues_16.msgs") == QUEUE_MESSAGES
    assert figure(result, "queues_10000.msgs") == QUEUE_MESSAGES
    sync = figure(result, "sync_flush_64_writers")
    assert sync["writers"] == 64
    assert sync["failed"] == 0, f"{sync['failed']} SYNC_FLUSH puts failed"
    positive(sync["msgs"], "sync_flush_64_writers.msgs")
    # How much 10,000 queues cost relative to 16: a signed figure (noise can make it negative
    # on small runs), derived from the two rates it compares.
    cost = figure(result, "cost_of_10000_queues_ratio")
    assert isinstance(cost, int | float)
    assert math.isfinite(cost)
    rate_16, rate_10000 = result["queues_16"]["msgs_per_s"], result["queues_10000"]["msgs_per_s"]
    assert cost == pytest.approx(1 - rate_10000 / rate_16, abs=0.001)
    in_order = [result[f"queues_{q}"]["runs_in_order_msgs_per_s"] for q in (16, 10000)]
    assert sorted(in_order[0]) == sorted(figure(result, "queues_16.runs_msgs_per_s"))
    paired = statistics.median(1 - b / a for a, b in zip(*in_order, strict=True))
    assert figure(result, "cost_of_10000_queues_paired_ratio") == pytest.approx(paired, abs=0.001)
    rss = figure(result, "rss")
    assert rss["written_gb"] == RSS_GB
    for key in ("rss_mb_first_last_max", "rss_anon_mb_first_last_max"):
        assert len(rss[key]) == 3
        for i, v in enumerate(rss[key]):
            positive(v, f"rss.{key}[{i}]")


def orbit_bench(kind: str, *flags: str) -> str:
    """Run ``orbit bench <kind> <flags>``; its stdout once it exits 0."""
    proc = subprocess.run(
        [sys.executable, "-m", "data_plane.cli", "bench", kind, *flags],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, f"orbit bench {kind} exited {proc.returncode}:\n{proc.stderr[-4000:]}"
    return proc.stdout


def test_bench_store_prints_and_writes_every_figure(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    stdout = orbit_bench(
        "store",
        "--messages", str(MESSAGES),
        "--queue-messages", str(QUEUE_MESSAGES),
        "--sync-seconds", "0.3",
        "--rss-gb", str(RSS_GB),
        "--disk-mb", str(DISK_MB),
        "--repeats", str(REPEATS),
        "--dir", str(tmp_path / "bench"),
        "--out", str(out),
    )  # fmt: skip
    printed = json.loads(stdout)
    written = json.loads(out.read_text())
    assert printed["schema"] == written["schema"] == "orbit.bench.store/1"
    check_figures(printed)
    check_figures(written)
    positive(printed["machine"]["python_loop_ns"], "machine.python_loop_ns")  # the machine's speed this hour

    # The file has the RSS samples too, taken while writing up to the amount asked for.
    samples = written["rss"]["samples"]
    assert len(samples) >= 2
    for i, s in enumerate(samples):
        for key in ("VmRSS", "RssAnon", "RssFile", "written_bytes"):
            positive(s[key], f"rss.samples[{i}].{key}")
    steps = [s["written_bytes"] for s in samples]
    assert steps == sorted(steps)
    assert steps[-1] >= RSS_GB * (1 << 30)
    # Stdout is the file without the samples.
    assert "samples" not in printed["rss"]
    without_samples = {**written, "rss": {k: v for k, v in written["rss"].items() if k != "samples"}}
    assert printed == without_samples


@pytest.mark.parametrize(
    ("order", "warm"),
    [((), ()), (("--latency-first", "--no-grpc"), ("--warm-memory-mb", "0"))],
    ids=["bulk-first", "latency-first-memory-not-warmed-no-grpc"],
)
def test_bench_e2e_prints_and_writes_every_figure(
    tmp_path: Path, order: tuple[str, ...], warm: tuple[str, ...]
) -> None:
    """``orbit bench e2e`` with one-second phases, in either order: every figure the issue asks
    for is there and positive, nothing failed, and the consumers read every message the
    producers stored (at least once)."""
    out = tmp_path / "e2e.json"
    stdout = orbit_bench(
        "e2e", "--quick", "--seconds", "1", "--pull-batch-size", "64", *order, *warm,
        "--dir", str(tmp_path / "cluster"), "--out", str(out),
    )  # fmt: skip
    result = json.loads(stdout)
    assert json.loads(out.read_text()) == result
    assert result["options"]["latency_first"] is bool(order)
    # Memory warmed before the cluster started (--quick: 64 MiB, written four times over), and
    # how fast it came; not at all with --warm-memory-mb 0.
    if warm:
        assert result["options"]["warm_memory_mb"] == 0
        assert "page_cache_write_before" not in result["machine"]
    else:
        assert result["options"]["warm_memory_mb"] == 64
        before = result["machine"]["page_cache_write_before"]
        assert before["megabytes"] == 256
        positive(before["mb_per_s"], "machine.page_cache_write_before.mb_per_s")
    ran = [k for k in result if k in ("publish_batched", "publish_sync_16", "consume", "half_peak")]
    expected = ["publish_sync_16", "half_peak", "publish_batched", "consume"]
    assert ran == (expected if order else ["publish_batched", "publish_sync_16", "consume", "half_peak"])
    assert result["options"]["seconds"] == 1
    assert result["options"]["pull_batch_size"] == 64
    for path in ("publish_batched.msgs_per_s", "publish_sync_16.msgs_per_s", "consume.msgs_per_s"):
        positive(figure(result, path), path)
    for path, quantiles in (
        ("publish_sync_16.send_latency_ms", ("p50", "p99", "p99.9")),
        ("half_peak.send_latency_ms", ("p50", "p99", "p99.9")),
        ("half_peak.with_consumer.e2e_latency_ms", ("p50", "p99")),
    ):
        hist = figure(result, path)
        for q in quantiles:
            assert q in hist, f"{path} has no {q} (have {sorted(hist)})"
            positive(hist[q], f"{path}.{q}")
    assert result["publish_batched"]["errors"] == 0
    assert result["publish_sync_16"]["errors"] == 0
    assert result["publish_sync_16"]["processes"] == result["options"]["sync_processes"] == 1
    # CPU a message of the broker and of the clients, per phase (from /proc: Linux only).
    # At the phase's rate, no role can have used more cores than the machine has (a unit slip
    # would show as a thousand times that).
    if sys.platform == "linux":
        phases = (("publish_batched", "producers"), ("publish_sync_16", "producers"), ("consume", "consumers"))
        for phase, clients in phases:
            cpu = figure(result, f"{phase}.cpu_us_per_msg")
            assert set(cpu) == {"broker", clients}, cpu
            rate = result[phase]["msgs_per_s"]
            for who, us in cpu.items():
                cores = positive(us, f"{phase}.cpu_us_per_msg.{who}") * rate / 1e6
                assert cores <= 1.25 * (os.cpu_count() or 1), (phase, who, cpu, rate)
        # The open-loop phase: CPU a message and the share of a core each process used, which
        # agree with each other at the phase's rate (one process each: at most about a core).
        half_cpu = figure(result, "half_peak.cpu_us_per_msg")
        shares = figure(result, "half_peak.cpu_core_share")
        assert set(half_cpu) == set(shares) == {"broker", "publisher"}, (half_cpu, shares)
        measured = result["half_peak"]["send_latency_ms"]["count"]
        for who, us in half_cpu.items():
            share = positive(shares[who], f"half_peak.cpu_core_share.{who}")
            assert share <= 1.25, shares
            seconds = result["options"]["seconds"]
            per_msg_share = positive(us, f"half_peak.cpu_us_per_msg.{who}") * measured / 1e6 / seconds
            assert per_msg_share == pytest.approx(share, rel=0.3, abs=0.03), (who, us, share, measured)
    # The machine's speed this hour, beside the figures it bounds.
    positive(result["machine"]["python_loop_ns"], "machine.python_loop_ns")
    positive(result["machine"]["page_cache_write"]["mb_per_s"], "machine.page_cache_write.mb_per_s")
    consume = result["consume"]
    positive(consume["stored"], "consume.stored")
    assert consume["consumed"] >= consume["stored"], consume
    half = result["half_peak"]
    # The open-loop phases run their warm-up (0.5 s in --quick) before the measured second, at
    # the same rate; its sends are counted apart, every send once.
    assert half["warmup_s"] == 0.5
    for phase in (half, half["with_consumer"]):
        measured, warm = phase["send_latency_ms"]["count"], phase["warmup_send_latency_ms"]["count"]
        positive(warm, "warmup_send_latency_ms.count")
        assert measured + warm == phase["acked"], phase
        assert measured == pytest.approx(2 * warm, rel=0.05), phase
    # only the measured sends carry the time the end-to-end consumer reads (at least once each)
    wc = half["with_consumer"]
    assert wc["e2e_latency_ms"]["count"] >= wc["send_latency_ms"]["count"], wc
    assert wc["e2e_latency_ms"]["count"] < wc["consumed"], wc
    assert half["errors"] == 0
    # the broker's loop stalls over the phase, from its runtime figures (a count; where the
    # last one was when there were any)
    stalls = half["broker_loop_stalls"]
    assert stalls["count"] >= 0, stalls
    assert (stalls["count"] > 0) == ("last_at" in stalls), stalls
    # the publisher's own lateness: at least a wake-up's share of a tick, within the phase's span
    late = half["publisher_lateness"]
    assert 0 < late["max_ms"] < 1000 * (half["warmup_s"] + result["options"]["seconds"]), late
    assert late["wakeups_over_5ms"] >= 0
    assert (late["wakeups_over_5ms"] > 0) == (late["max_ms"] > 5), late
    assert half["with_consumer"]["errors"] == 0
    assert half["with_consumer"]["consumed"] >= half["with_consumer"]["acked"] > 0, half
    # The gRPC endpoint's phases (loadtest/grpc_e2e.py), beside the remoting ones; --no-grpc: none.
    assert result["met"] == verdict(result)
    if order:
        assert result["options"]["grpc"] is False
        assert not any(k.startswith("grpc_") for k in result)
        assert result["targets"] == targets()
        return
    for path in ("grpc_batched.msgs_per_s", "grpc_unary_16.msgs_per_s", "grpc_receive_ack.msgs_per_s"):
        positive(figure(result, path), path)
    for phase in ("grpc_batched", "grpc_unary_16", "grpc_receive_ack", "grpc_half_peak"):
        assert result[phase]["errors"] == 0, result[phase]
    positive(figure(result, "grpc_half_peak.send_latency_ms.p99"), "grpc_half_peak.send_latency_ms.p99")
    # Every message the batched gRPC phase stored was received and acknowledged (at least once).
    assert result["grpc_receive_ack"]["consumed"] >= result["grpc_batched"]["msgs_per_s"], result["grpc_receive_ack"]
    # The issues' targets (the gRPC endpoint's too).
    assert result["targets"] == targets(result)
    assert set(result["targets"]) > set(targets())


def test_bench_e2e_runs_several_times_on_fresh_clusters_past_a_failed_run_and_summarizes_the_targets(
    tmp_path: Path,
) -> None:
    """``--runs 3``: the whole benchmark three times, each on a cluster of its own. The first run
    cannot finish (its directory is taken by a file): it is reported as failed, the runs after
    it still run and count, and the command exits 1. stdout has each target over the runs (met
    in how many, median, lowest, highest) and each run's figures, the --out file the same with
    every run's full result."""
    cluster = tmp_path / "cluster"
    cluster.mkdir()
    (cluster / "run-1").write_text("not a directory")
    out = tmp_path / "runs.json"
    proc = subprocess.run(
        [sys.executable, "-m", "data_plane.cli", "bench", "e2e", "--quick", "--seconds", "1", "--runs", "3",
         "--warm-memory-mb", "16", "--no-grpc", "--dir", str(cluster), "--out", str(out)],
        capture_output=True, text=True, cwd=REPO, timeout=600, check=False,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-4000:]
    assert "run 1 failed: BenchDirectoryError" in proc.stderr, proc.stderr[-4000:]
    printed = json.loads(proc.stdout)
    written = json.loads(out.read_text())
    results = written.pop("results")
    assert written == printed
    assert len(results) == 3
    failed, ran = results[0], results[1:]
    assert "run-1" in failed["error"], failed
    # Each run is a whole benchmark of its own, on its own cluster's directory.
    assert sorted(p.name for p in cluster.iterdir()) == ["run-1", "run-2", "run-3"]
    assert [r["options"]["directory"] for r in ran] == [str(cluster / "run-2"), str(cluster / "run-3")]
    for r in ran:
        for path in ("publish_batched.msgs_per_s", "publish_sync_16.msgs_per_s", "consume.msgs_per_s"):
            positive(figure(r, path), path)
        positive(figure(r, "half_peak.send_latency_ms.p99"), "half_peak.send_latency_ms.p99")
        assert r["publish_sync_16"]["errors"] == r["half_peak"]["errors"] == 0
        assert r["met"] == verdict(r)
        assert r["machine"]["page_cache_write_before"]["megabytes"] == 64  # each run warms memory first
    # The summary is the runs' figures, target by target; the failed run met nothing.
    summary = printed["summary"]
    assert (summary["runs"], summary["failed_runs"]) == (3, 1)
    first = printed["runs"][0]
    assert "run-1" in first["error"], first
    assert not any(first["met"].values())
    assert summary["all_met_runs"] == sum(r["met"]["all"] for r in ran)
    assert summary["python_loop_ns"] == [None, *(r["machine"]["python_loop_ns"] for r in ran)]
    for name, bound in targets().items():
        t = summary["targets"][name]
        values = [brief(r)["figures"][name] for r in ran]
        assert t["target"] == bound
        assert t["values"] == [None, *values]
        assert t["met_runs"] == sum(r["met"][name] for r in ran)
        assert (t["min"], t["max"]) == (min(values), max(values))
        assert t["median"] == pytest.approx(statistics.median(values))
    assert printed["runs"][1:] == [brief(r) for r in ran]


@pytest.mark.parametrize("taken", ["a file", "a directory with a store in it"])
def test_bench_e2e_refuses_a_directory_that_is_not_empty(tmp_path: Path, taken: str) -> None:
    """The benchmark runs a fresh cluster: a --dir holding anything (an earlier run's store, which
    the broker would recover) is refused before any server starts, and left as it was."""
    target = tmp_path / "cluster"
    if taken == "a file":
        target.write_text("x")
    else:
        (target / "broker-a").mkdir(parents=True)
        (target / "broker-a" / "commitlog").write_text("earlier run")
    before = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    proc = subprocess.run(
        [sys.executable, "-m", "data_plane.cli", "bench", "e2e", "--quick", "--dir", str(target)],
        capture_output=True, text=True, cwd=REPO, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-4000:]
    assert f"{target} is not an empty directory" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stdout == ""
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == before


@pytest.mark.parametrize(
    ("bench", "flag", "value"),
    [("e2e", "--runs", "0"), ("e2e", "--runs", "101"), ("e2e", "--runs", "two"), ("e2e", "--warm-memory-mb", "-1"),
     ("e2e", "--warm-memory-mb", "4097"), ("e2e", "--warm-memory-mb", "1G"), ("e2e", "--seconds", "0"),
     ("e2e", "--seconds", "nan"), ("e2e", "--seconds", "3601"), ("e2e", "--pull-batch-size", "0"),
     ("e2e", "--pull-batch-size", "1025"), ("store", "--messages", "-5"), ("store", "--queue-messages", "0"),
     ("store", "--sync-seconds", "inf"), ("store", "--rss-gb", "0"), ("store", "--disk-mb", "lots"),
     ("store", "--repeats", "0"), ("ha", "--seconds", "-1"), ("ha", "--catch-up-mb", "0")],
)  # fmt: skip
def test_bench_refuses_a_figure_out_of_range(bench: str, flag: str, value: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "data_plane.cli", "bench", bench, flag, value],
        capture_output=True, text=True, cwd=REPO, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 2, proc
    assert flag in proc.stderr, proc.stderr
    assert value in proc.stderr, proc.stderr
    assert proc.stdout == ""


def test_bench_e2e_tls_runs_it_plain_and_over_tls_and_reports_each_ratio() -> None:
    """``--tls``: the run plain and over TLS (the clients verifying the local CA), each
    throughput's TLS/plain ratio, and whether every ratio met the 0.7 target (the gRPC phases left out:
    the TLS of the gRPC endpoint is tests/security/test_tls.py's)."""
    printed = json.loads(orbit_bench("e2e", "--quick", "--seconds", "1", "--tls", "--warm-memory-mb", "0", "--no-grpc"))
    (pair,) = printed["pairs"]
    assert pair["plain"]["options"]["tls"] is False
    assert pair["tls"]["options"]["tls"] is True
    for phase in ("publish_batched", "publish_sync_16", "consume"):
        plain, tls = pair["plain"][phase]["msgs_per_s"], pair["tls"][phase]["msgs_per_s"]
        positive(plain, phase)
        positive(tls, phase)
        assert pair["tls_vs_plain"][phase] == round(tls / plain, 3)
        assert printed["tls_vs_plain"][phase] == pair["tls_vs_plain"][phase]  # the median of one pair
    assert printed["tls_target"] == 0.7
    assert printed["tls_met"] == all(r >= 0.7 for r in printed["tls_vs_plain"].values())
