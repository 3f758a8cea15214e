"""An elastic case's plot, as SVG (matplotlib, Agg): above, the offered rate (per 10 s window),
the acknowledged rate (per second) and the topic's writable and readable queues (right axis);
below, the send p99 of each 10 s window against the 20 ms target."""

from __future__ import annotations

import math
from typing import Any

from loadtest.elastic_report import plot_rows
from loadtest.elastic_verdict import SEND_P99_MS


def write_svg(result: dict[str, Any], path: str, *, title: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = plot_rows(result)
    fig, (top, low) = plt.subplots(2, 1, figsize=(9, 6), sharex=True, height_ratios=(3, 2))
    top.step(s["w_t"], s["offered"], where="mid", color="tab:gray", label="offered msgs/s (10 s)")
    top.plot(s["t"], s["acked"], color="tab:blue", linewidth=0.8, label="acknowledged msgs/s")
    top.set_ylabel("msgs/s")
    q = top.twinx()
    q.step(s["q_t"], s["writable"], where="post", color="tab:red", label="writable queues")
    q.step(s["q_t"], s["readable"], where="post", color="tab:orange", linestyle="--", label="readable queues")
    q.set_ylabel("queues")
    q.set_ylim(bottom=0)
    lines = top.get_legend_handles_labels()[0] + q.get_legend_handles_labels()[0]
    top.legend(lines, [str(line.get_label()) for line in lines], fontsize=7, loc="upper right")
    top.set_title(title, fontsize=9)
    p99 = [math.nan if v is None else max(v, 0.01) for v in s["send_p99"]]
    low.step(s["w_t"], p99, where="mid", color="tab:purple", label="send p99 per 10 s")
    low.axhline(SEND_P99_MS, color="tab:green", linestyle=":", label="target 20 ms")
    low.set(yscale="log", ylabel="ms", xlabel="s since start (warm-up first)")
    low.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, format="svg", metadata={"Date": None})
    plt.close(fig)
    return path
