#!/usr/bin/env python3
"""Charts of the benchmarks' JSON results, by what the file holds.

- `rows_per_second --json` results: cumulative rows against time per configuration, the
  picture the SAMZA-543 listing describes in text (rows written on the y axis, milliseconds on
  the x axis; a steeper line is a faster store).
- A tasks-per-process table (`{"tasks": [{"n", "system", "fresh_s", "restart_s",
  "rss_fresh_mb", "rss_restart_mb"}, ...]}`, the table of BENCHMARKS.md's "Many tasks per process"):
  time until every task runs and resident memory against the number of tasks, log-log, each
  system beside a line of linear growth from its smallest N.
- The comparison with Kafka Streams (`{"ratios": [...], "restore": {...}}`, the figures of
  BENCHMARKS.md's "Current figures", each with its command and date): kstate's rate over Kafka
  Streams' (or Kafka Streams' time over kstate's) per line, PLAINTEXT and SASL_SSL, with the range
  of runs where one is given; and the restore rate of both systems.

    benches/chart.py benches/rows_per_second.json benches/rows_per_second.png
    benches/chart.py benches/tasks_per_process.json benches/tasks_per_process.png
    benches/chart.py benches/kafka_streams.json benches/kafka_streams.png

Needs matplotlib; when it is missing, the script installs it into a virtual environment under
~/.cache/kstate/chart-venv and runs itself again from there.
"""

import json
import os
import subprocess
import sys
import venv

VENV = os.path.join(os.path.expanduser("~"), ".cache", "kstate", "chart-venv")


def ensure_matplotlib():
    try:
        import matplotlib  # noqa: F401
        return
    except ImportError:
        pass
    if sys.prefix == VENV:
        sys.exit("chart.py: matplotlib is still missing inside " + VENV)
    python = os.path.join(VENV, "bin", "python")
    if not os.path.exists(python):
        venv.create(VENV, with_pip=True)
    subprocess.check_call([python, "-m", "pip", "install", "--quiet", "matplotlib"])
    os.execv(python, [python] + sys.argv)


def rows_chart(plt, run, output):
    fig, ax = plt.subplots(figsize=(9, 5.5), dpi=120)
    for config in run["configs"]:
        points = [(0.0, 0)] + [(ms, rows) for rows, ms in config["progress"]]
        xs = [ms for ms, _ in points]
        ys = [rows for _, rows in points]
        threads = config.get("threads", 1)
        name = config["config"] if threads == 1 else f'{config["config"]} x{threads} threads'
        label = f'{name} ({config["rows_per_sec"]:,.0f} rows/s)'
        ax.plot(xs, ys, marker="o", markersize=3, label=label)
    ax.set_xlabel("elapsed (ms)")
    ax.set_ylabel("rows written (cumulative)")
    ax.set_title(
        f'rows_per_second: {run["rows"]:,} rows, {run["value_size"]}-byte values, batch {run["batch"]}'
    )
    ax.grid(True, alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(output)


def tasks_chart(plt, run, output):
    rows = run["tasks"]
    systems = sorted({r["system"] for r in rows})
    panels = [
        ("time until every task runs (s)", [("fresh_s", "fresh"), ("restart_s", "restart")]),
        ("resident memory (MB)", [("rss_fresh_mb", "fresh"), ("rss_restart_mb", "restart")]),
    ]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.8), dpi=120)
    for ax, (ylabel, series) in zip(axes, panels):
        for system in systems:
            mine = sorted((r for r in rows if r["system"] == system), key=lambda r: r["n"])
            for field, start in series:
                points = [(r["n"], r[field]) for r in mine if r.get(field) is not None]
                if not points:
                    continue
                line = ax.plot(
                    [n for n, _ in points],
                    [v for _, v in points],
                    marker="o",
                    linestyle="-" if start == "fresh" else "--",
                    label=f"{system} {start}",
                )[0]
                # Linear growth from the smallest N: a curve above it grows worse than linearly.
                n0, v0 = points[0]
                ax.plot(
                    [n for n, _ in points],
                    [v0 * n / n0 for n, _ in points],
                    color=line.get_color(),
                    linestyle=":",
                    linewidth=0.8,
                    alpha=0.6,
                )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("tasks in the process (3 stores each)")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f'{run.get("title", "tasks per process")} (dotted: linear growth)', fontsize=10)
    fig.tight_layout()
    fig.savefig(output)


def comparison_chart(plt, run, output):
    ratios = run["ratios"]
    restore = run["restore"]
    fig, (left, right) = plt.subplots(
        1, 2, figsize=(12, 5.5), dpi=120, gridspec_kw={"width_ratios": [2.2, 1]}
    )
    ys = list(range(len(ratios)))[::-1]
    height = 0.38
    for offset, key, label in [(height / 2, "plaintext", "PLAINTEXT"), (-height / 2, "sasl_ssl", "SASL_SSL")]:
        points = [(y + offset, r[key], r.get("range")) for y, r in zip(ys, ratios) if key in r]
        if not points:
            continue
        bars = left.barh([p[0] for p in points], [p[1] for p in points], height=height, label=label)
        for y, value, spread in points:
            end = max([value] + list(spread or []))
            left.text(end + 0.1, y, f"{value:.2f}x", va="center", fontsize=7)
        for y, value, spread in points:
            if key == "plaintext" and spread:
                left.plot(spread, [y, y], color="black", linewidth=1)
    left.axvline(1.0, color="grey", linestyle="--", linewidth=0.8)
    left.set_yticks(ys)
    left.set_yticklabels([r["line"] for r in ratios], fontsize=8)
    left.set_xlabel("kstate / Kafka Streams (rate; for times, Kafka Streams' over kstate's)")
    left.grid(True, axis="x", alpha=0.3)
    left.legend(fontsize=8, loc="lower right")
    left.set_title("ratios (black: the range of the runs)", fontsize=9)

    systems = [r["system"] for r in restore["rates"]]
    xs = range(len(systems))
    width = 0.38
    for offset, key, label in [(-width / 2, "plaintext", "PLAINTEXT"), (width / 2, "sasl_ssl", "SASL_SSL")]:
        values = [r[key] for r in restore["rates"]]
        bars = right.bar([x + offset for x in xs], values, width=width, label=label)
        for bar, value in zip(bars, values):
            right.text(bar.get_x() + bar.get_width() / 2, value, f"{value / 1e3:,.0f}k",
                       ha="center", va="bottom", fontsize=7)
    right.set_xticks(list(xs))
    right.set_xticklabels(systems)
    right.set_ylabel("records restored per second")
    right.yaxis.set_major_formatter(lambda value, _: f"{value / 1e3:,.0f}k")
    right.grid(True, axis="y", alpha=0.3)
    right.legend(fontsize=8)
    right.set_title("restore rate (the restore line's runs)", fontsize=9)
    fig.suptitle(run.get("title", "kstate against Kafka Streams"), fontsize=10)
    fig.tight_layout()
    fig.savefig(output)


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: chart.py RESULTS.json OUTPUT.png")
    ensure_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(sys.argv[1]) as f:
        run = json.load(f)
    if "tasks" in run:
        tasks_chart(plt, run, sys.argv[2])
    elif "ratios" in run:
        comparison_chart(plt, run, sys.argv[2])
    elif "configs" in run:
        rows_chart(plt, run, sys.argv[2])
    else:
        sys.exit(f"chart.py: {sys.argv[1]} holds no rows_per_second results, tasks table or comparison")
    print("wrote", sys.argv[2])


if __name__ == "__main__":
    main()
