#!/usr/bin/env python3
"""Cumulative rows against time per configuration, from `rows_per_second --json`.

The picture the SAMZA-543 listing describes in text: one line per configuration, rows written
on the y axis, milliseconds on the x axis; a steeper line is a faster store.

    benches/chart.py results.json benches/rows_per_second.png

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


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: chart.py RESULTS.json OUTPUT.png")
    ensure_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(sys.argv[1]) as f:
        run = json.load(f)
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
    fig.savefig(sys.argv[2])
    print("wrote", sys.argv[2])


if __name__ == "__main__":
    main()
