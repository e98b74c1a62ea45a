"""The plot of docs/benchmarks.md: jobs/s versus handlers and processes, ours and the peers.

python -m benchmarks.plot RESULTS.json OUT.png
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

COLORS = {
    "django_dbworker": "tab:blue",
    "pgqueuer": "tab:green",
    "procrastinate": "tab:orange",
    "django-tasks-db": "tab:red",
}
STYLES = {"noop": "-", "sleep1ms": "--", "async-noop": "-.", "async-sleep1ms": (0, (1, 1))}
VARIANT_LABEL = {
    "noop": "no-op",
    "sleep1ms": "1 ms",
    "noop-ack": "no-op, ack_each_job",
    "insert": "one INSERT",
    "insert-atomic": "one INSERT, atomic",
    "async-noop": "no-op, async def",
    "async-sleep1ms": "await 1 ms",
    "async-wait100ms": "await 100 ms, 1,000 in flight",
}


def plot(result: dict[str, Any], out: Path) -> None:
    """One panel per number of worker processes, side by side on one y scale."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    counts = sorted({r["processes"] for r in result["throughput"]}) or [1]
    fig, axes = plt.subplots(
        1, len(counts), figsize=(6 * len(counts) + 3, 5.5), dpi=110, sharey=True, squeeze=False
    )
    for ax, processes in zip(axes[0], counts, strict=True):
        _panel(ax, result, processes)
    axes[0][0].set_ylabel("jobs/s (median of repetitions, bars: range)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=7.5, loc="center right")
    fig.suptitle(
        f"Draining pre-enqueued jobs — {result['started_at'][:16]} UTC, "
        f"{result['machine']['cores']} cores"
    )
    fig.tight_layout(rect=(0, 0, 0.78, 1))
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)


def _panel(ax: Any, result: dict[str, Any], processes: int) -> None:
    rows = [r for r in result["throughput"] if r["processes"] == processes]
    swept = {"django_dbworker", "procrastinate"}
    xs = sorted({r["value"] for r in rows if r["system"] in swept}) or [1]
    for system, variant in sorted({(r["system"], r["variant"]) for r in rows}):
        series = sorted(
            (r for r in rows if r["system"] == system and r["variant"] == variant),
            key=lambda r: r["value"],
        )
        color, style = COLORS.get(system, "black"), STYLES.get(variant, ":")
        label = f"{series[0]['label']}, {VARIANT_LABEL.get(variant, variant)}"
        if system in swept:
            x = [r["value"] for r in series]
            y = [r["jobs_per_s"]["median"] for r in series]
            err = [
                [r["jobs_per_s"]["median"] - r["jobs_per_s"]["min"] for r in series],
                [r["jobs_per_s"]["max"] - r["jobs_per_s"]["median"] for r in series],
            ]
            ax.errorbar(
                x, y, yerr=err, color=color, linestyle=style, marker="o", capsize=3, label=label
            )
        else:
            best = max(series, key=lambda r: r["jobs_per_s"]["median"])
            extra = " (its best batch)" if system == "pgqueuer" else " (one thread)"
            ax.hlines(
                best["jobs_per_s"]["median"],
                xs[0],
                xs[-1],
                colors=color,
                linestyles=style,
                label=label + extra,
            )
    for row in result.get("sql", []):
        if row["kind"] == "pgbench":
            ax.hlines(
                row["jobs_per_s"]["median"],
                xs[0],
                xs[-1],
                colors="grey",
                linestyles=":",
                label=f"SQL ceiling: pgbench, batch {row['batch']}, {row['clients']} clients",
            )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(xs, [str(x) for x in xs])
    ax.set_xlabel("handler threads per process (procrastinate: concurrency)")
    ax.set_title(f"{processes} worker process{'es' if processes > 1 else ''}")
    ax.grid(True, which="both", alpha=0.3)


if __name__ == "__main__":
    plot(json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2]))
