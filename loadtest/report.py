"""Results: the JSON document (schema ``orbit-loadtest/1``, described in docs/loadtest.md), the
figures derived from it (ratios to the machine's limits and to peers), PNG plots and one
self-contained HTML page (the plots inlined), all written to one output directory.

Plots per case, one line per target: throughput over time (published solid, consumed dashed),
p99 latency over time (send and end-to-end), and the latency distribution (percentile on a
log scale of 1/(1-p), as HdrHistogram plots do).
"""

from __future__ import annotations

import base64
import html
import math
import os
import platform
import time
from typing import Any

import orjson

from data_plane.interpreter import interpreter_facts
from loadtest.histogram import decode_hist, distribution_ms

RESULT_FILE = "result.json"
REPORT_FILE = "report.html"


def machine() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        **interpreter_facts(),
        "loadavg_1m": round(os.getloadavg()[0], 2),
    }


def _ok(cases: list[dict[str, Any]], name: str, target: str) -> dict[str, Any] | None:
    for c in cases:
        if c["name"] == name and c["target"] == target and c.get("status") == "ok":
            return c
    return None


def _ratio(a: float | None, b: float | None) -> float | None:
    """a / b to 4 significant digits (shares of a machine's limit can be small)."""
    return float(f"{a / b:.4g}") if a and b else None


def derive(doc: dict[str, Any]) -> dict[str, Any]:
    """Ratios: each Orbit case's publish bandwidth against the disk's and loopback's, and Orbit
    against each peer on the same case (rates: Orbit / peer, > 1 = Orbit faster; p99 latency:
    Orbit / peer, < 1 = Orbit quicker)."""
    limits = doc.get("machine_limits") or {}
    disk = limits.get("disk_seq_write", {}).get("mb_per_s")  # MiB/s
    tcp = limits.get("loopback_tcp", {}).get("mb_per_s")  # MB/s
    cases = doc["cases"]
    out: dict[str, Any] = {}
    for c in cases:
        if c["target"] != "orbit" or c.get("status") != "ok" or "publish" not in c:
            continue
        pub_bytes = c["publish"]["mb_per_s"] * 1e6
        r: dict[str, Any] = {
            "publish_share_of_disk_bandwidth": _ratio(pub_bytes, disk * (1 << 20) if disk else None),
            "publish_share_of_loopback_tcp": _ratio(pub_bytes, tcp * 1e6 if tcp else None),
        }
        for peer in ("nats", "redis"):
            p = _ok(cases, c["name"], peer)
            if p is None or "publish" not in p:
                continue
            r[f"vs_{peer}"] = {
                "publish_msgs_per_s": _ratio(c["publish"]["msgs_per_s"], p["publish"]["msgs_per_s"]),
                "consume_msgs_per_s": _ratio(
                    c.get("consume", {}).get("msgs_per_s"), p.get("consume", {}).get("msgs_per_s")
                ),
                "send_p99_ms": _ratio(c["publish"]["send_latency_ms"]["p99"], p["publish"]["send_latency_ms"]["p99"]),
                "e2e_p99_ms": _ratio(
                    c.get("consume", {}).get("e2e_latency_ms", {}).get("p99"),
                    p.get("consume", {}).get("e2e_latency_ms", {}).get("p99"),
                ),
            }
        out[c["name"]] = r
    return out


def finish(doc: dict[str, Any], *, limits: dict[str, Any] | None, note: str) -> dict[str, Any]:
    doc["created_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    doc["machine"] = {**machine(), "note": note}
    doc["machine_limits"] = limits
    doc["ratios"] = derive(doc)
    return doc


# --- plots ----------------------------------------------------------------------------------------
def _plots(doc: dict[str, Any], out_dir: str) -> dict[str, list[str]]:
    """PNG files per case name (matplotlib with the Agg backend: no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_name: dict[str, list[dict[str, Any]]] = {}
    for c in doc["cases"]:
        if c.get("status") == "ok":
            by_name.setdefault(c["name"], []).append(c)
    files: dict[str, list[str]] = {}
    for name, cases in by_name.items():
        safe = "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in name)
        names = []
        fig, ax = plt.subplots(figsize=(8, 3.5))
        for c in cases:
            t = [r["t_s"] for r in c["timeline"]]
            ax.plot(t, [r["published_msgs"] for r in c["timeline"]], label=f"{c['target']} published")
            ax.plot(t, [r["consumed_msgs"] for r in c["timeline"]], "--", label=f"{c['target']} consumed")
        _mark_warmup(ax, cases)
        ax.set(title=f"{name}: throughput", xlabel="s since start (warm-up first)", ylabel="msgs/s")
        ax.legend(fontsize=7)
        names.append(_save(fig, out_dir, f"{safe}-throughput.png"))
        fig, ax = plt.subplots(figsize=(8, 3.5))
        for c in cases:
            rows = [r for r in c["timeline"] if r["send_latency_ms"]["count"] or r["e2e_latency_ms"]["count"]]
            t = [r["t_s"] for r in rows]
            ax.plot(t, [r["send_latency_ms"]["p99"] or math.nan for r in rows], label=f"{c['target']} send p99")
            ax.plot(t, [r["e2e_latency_ms"]["p99"] or math.nan for r in rows], "--", label=f"{c['target']} e2e p99")
            ax.plot(t, [r["send_latency_ms"]["p50"] or math.nan for r in rows], ":", label=f"{c['target']} send p50")
        _mark_warmup(ax, cases)
        ax.set(title=f"{name}: latency over time", xlabel="s since start (warm-up first)", ylabel="ms", yscale="log")
        ax.legend(fontsize=7)
        names.append(_save(fig, out_dir, f"{safe}-latency-time.png"))
        fig, ax = plt.subplots(figsize=(8, 3.5))
        for c in cases:
            for what, hist in (
                ("send", c.get("publish", {}).get("send_latency_hist", "")),
                ("e2e", c.get("consume", {}).get("e2e_latency_hist", "")),
            ):
                pts = distribution_ms(decode_hist(hist))
                if pts:
                    xs = [1 / max(1e-6, 1 - p / 100) for p, _ in pts]
                    ax.plot(xs, [v for _, v in pts], label=f"{c['target']} {what}")
        ax.set(title=f"{name}: latency distribution", xlabel="percentile", ylabel="ms", xscale="log", yscale="log")
        ticks = [1, 2, 10, 100, 1000, 10000, 100000]
        ax.set_xticks(ticks, ["0", "50", "90", "99", "99.9", "99.99", "99.999"])
        ax.legend(fontsize=7)
        names.append(_save(fig, out_dir, f"{safe}-latency-distribution.png"))
        files[name] = names
    return files


def _mark_warmup(ax: Any, cases: list[dict[str, Any]]) -> None:
    warmup = cases[0].get("settings", {}).get("warmup_s")
    if warmup:
        ax.axvline(warmup, color="grey", linewidth=0.8, linestyle=":")


def _save(fig: Any, out_dir: str, name: str) -> str:
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, name), dpi=90)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return name


# --- HTML -----------------------------------------------------------------------------------------
def _cell(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.3f}".rstrip("0").rstrip(".")
    if isinstance(v, int):
        return f"{v:,}"
    return html.escape(str(v))


def _pre(value: Any) -> str:
    return "<pre>" + html.escape(orjson.dumps(value, option=orjson.OPT_INDENT_2).decode()) + "</pre>"


def _html(doc: dict[str, Any], plots: dict[str, list[str]], out_dir: str) -> str:
    e = html.escape
    durability = sorted(
        {f"<li><b>{e(c['target'])}</b> ({e(c['name'])}): {e(c['durability'])}</li>" for c in doc["cases"]}
    )
    rows = []
    for c in doc["cases"]:
        pub, con = c.get("publish", {}), c.get("consume", {})
        send, e2e = pub.get("send_latency_ms", {}), con.get("e2e_latency_ms", {})
        values = (
            c["name"], c["target"], c.get("status"), pub.get("target_msgs_per_s"), pub.get("msgs_per_s"),
            pub.get("mb_per_s"), send.get("p50"), send.get("p99"), pub.get("errors"),
            pub.get("dropped_behind_schedule"), pub.get("generator_lag_ms", {}).get("p99"), con.get("consumed"),
            con.get("expected"), con.get("msgs_per_s"), e2e.get("p99"), c.get("reason", ""),
        )  # fmt: skip
        rows.append("<tr>" + "".join(f"<td>{_cell(v)}</td>" for v in values) + "</tr>")
    head = [
        "case", "target", "status", "target msgs/s", "published msgs/s", "MB/s", "send p50 ms", "send p99 ms",
        "errors", "dropped", "generator lag p99 ms", "consumed", "expected", "consumed msgs/s", "e2e p99 ms", "note",
    ]  # fmt: skip
    parts = [
        "<!doctype html><meta charset=utf-8><title>Orbit load test</title>",
        "<style>body{font:14px sans-serif;margin:2em}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}img{max-width:100%}</style>",
        f"<h1>Orbit load test: {e(doc['scenario']['name'])}</h1>",
        f"<p>{e(doc['scenario'].get('description', ''))}</p>",
        f"<p>Created {e(str(doc.get('created_at')))} on {e(str(doc.get('machine')))}</p>",
        "<h2>Machine limits</h2>" + _pre(doc.get("machine_limits")),
        "<h2>Cases</h2><table><tr>" + "".join(f"<th>{e(h)}</th>" for h in head) + "</tr>" + "".join(rows) + "</table>",
        "<h2>Durability of each target</h2><ul>" + "".join(durability) + "</ul>",
        "".join(f"<p><b>{e(k)}</b>: {e(v)}</p>" for k, v in (doc.get("peers_unavailable") or {}).items()),
        "<h2>Ratios</h2>" + _pre(doc.get("ratios")),
    ]
    for c in doc["cases"]:
        extra = {k: c[k] for k in ("tenants", "backlog") if k in c}
        if extra:
            for t in extra.get("tenants", {}).values():
                t.pop("send_latency_hist", None)
            parts.append(f"<h3>{e(c['name'])} on {e(c['target'])}</h3>" + _pre(extra))
    for name, files in plots.items():
        parts.append(f"<h2>{e(name)}</h2>")
        for f in files:
            with open(os.path.join(out_dir, f), "rb") as fh:
                data = base64.b64encode(fh.read()).decode()
            parts.append(f'<p><img alt="{e(f)}" src="data:image/png;base64,{data}"></p>')
    return "\n".join(parts)


def write(doc: dict[str, Any], out_dir: str, *, plots: bool = True) -> dict[str, str]:
    """result.json, the PNGs (when ``plots``: matplotlib is an optional dependency) and
    report.html in ``out_dir``; their paths."""
    os.makedirs(out_dir, exist_ok=True)
    result = os.path.join(out_dir, RESULT_FILE)
    with open(result, "wb") as f:
        f.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2) + b"\n")
    pngs = _plots(doc, out_dir) if plots else {}
    svgs = _elastic_svgs(doc, out_dir) if plots else []
    page = os.path.join(out_dir, REPORT_FILE)
    with open(page, "w") as f:
        f.write(_html(orjson.loads(orjson.dumps(doc)), pngs, out_dir))
    files = {p: os.path.join(out_dir, p) for ps in pngs.values() for p in ps}
    return {"json": result, "html": page, **files, **{os.path.basename(p): p for p in svgs}}


def _elastic_svgs(doc: dict[str, Any], out_dir: str) -> list[str]:
    """``<case>-elastic.svg`` for each elastic case that ran (loadtest/elastic_plot.py)."""
    from loadtest.elastic_plot import write_svg

    out = []
    for c in doc["cases"]:
        if c.get("status") == "ok" and "elastic" in c:
            safe = "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in c["name"])
            title = f"{doc['scenario']['name']} / {c['name']}: rate, queues and send p99"
            out.append(write_svg(c, os.path.join(out_dir, f"{safe}-elastic.svg"), title=title))
    return out


def summary_text(doc: dict[str, Any]) -> str:
    """A short plain-text table of the cases for the terminal."""
    lines = []
    for c in doc["cases"]:
        if c.get("status") != "ok":
            lines.append(f"{c['name']:<24} {c['target']:<6} not run: {c.get('reason', '')[:200]}")
            continue
        pub, con = c.get("publish", {}), c.get("consume", {})
        lines.append(
            f"{c['name']:<24} {c['target']:<6} pub {pub.get('msgs_per_s', 0):>10,.0f}/s "
            f"p99 {pub.get('send_latency_ms', {}).get('p99', 0):>8} ms  errors {pub.get('errors', 0)}  "
            f"con {con.get('msgs_per_s', 0):>10,.0f}/s e2e p99 {con.get('e2e_latency_ms', {}).get('p99', 0)} ms "
            f"({con.get('consumed', 0)}/{con.get('expected', 0)})"
        )
    return "\n".join(lines)
