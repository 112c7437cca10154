#!/usr/bin/env python3
"""Draws the curves of a galley metrics log (galley::MetricsLogger, JSON Lines) into a PNG.

    scripts/plot-metrics.py LOG.jsonl OUT.png [--title TEXT] [--x step|epoch|elapsed_s]

Panels: the loss; every key ending in "accuracy"; the throughput (samples_per_s) with the
loader's starvation on a second axis; the memory in use (host RSS, and GPU memory allocated per
device) when the log has it. Each event ("step", "epoch", ...) is its own curve: step lines as
lines, epoch lines as markers. The x axis is the step when the lines have one, else the epoch,
else the seconds since the logger started.

A file that several runs appended to is split into runs where the x value goes back (a fresh
run, or a resumed one that redoes steps after its last checkpoint); each run gets its own
colour. Values logged as non-finite (null, named in "nonfinite") are marked with a red dotted
line at their x. Lines that are not JSON (a line torn by a crash) are skipped with a warning.
"""
import argparse
import json
import math
import os
import sys


def read_log(path):
    records = []
    try:
        f = open(path, encoding="utf-8", errors="replace")
    except OSError as e:
        sys.exit(f"plot-metrics.py: cannot read {path}: {e.strerror}")
    with f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                r = json.loads(line)
            except ValueError:
                print(f"plot-metrics.py: {path}:{n}: not a JSON line, skipped", file=sys.stderr)
                continue
            if isinstance(r, dict):
                records.append(r)
    return records


def number(v):
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) \
        else None


def pick_x(records, wanted):
    if wanted:
        return wanted
    for key in ("step", "epoch"):
        if any(number(r.get(key)) is not None for r in records):
            return key
    return "elapsed_s"


def split_runs(records, x):
    """Lists of records, a new one wherever x goes back."""
    runs, last = [[]], None
    for r in records:
        v = number(r.get(x))
        if v is None:
            continue
        if last is not None and v < last:
            runs.append([])
        runs[-1].append(r)
        last = v
    return [run for run in runs if run]


def series(run, x, key, event, value=None):
    """(xs, ys) of `key` over the lines of `event` in `run`; `value` extracts it if given."""
    xs, ys = [], []
    for r in run:
        if r.get("event", "step") != event:
            continue
        y = value(r) if value else number(r.get(key))
        if y is not None:
            xs.append(r[x])
            ys.append(y)
    return xs, ys


def gpu_allocated(device):
    def get(r):
        g = r.get("gpu_memory")
        if isinstance(g, dict) and isinstance(g.get(device), dict):
            v = number(g[device].get("allocated"))
            return v / 2**20 if v is not None else None
        return None
    return get


def host_rss(r):
    v = number(r.get("host_rss_bytes"))
    return v / 2**20 if v is not None else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("log", help="the JSON Lines file galley::MetricsLogger wrote")
    ap.add_argument("out", help="the PNG to write")
    ap.add_argument("--title", help="figure title (default: the log's file name)")
    ap.add_argument("--x", choices=["step", "epoch", "elapsed_s"],
                    help="x axis (default: step, else epoch, else elapsed_s)")
    args = ap.parse_args()

    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("plot-metrics.py needs matplotlib, which this Python cannot import: "
                 "pip install matplotlib (or apt-get install python3-matplotlib)")

    records = read_log(args.log)
    if not records:
        sys.exit(f"plot-metrics.py: {args.log} holds no metrics lines")
    x = pick_x(records, args.x)
    runs = split_runs(records, x)
    if not runs:
        sys.exit(f"plot-metrics.py: no line of {args.log} has '{x}' (try --x)")
    events = []
    for r in records:
        e = r.get("event", "step")
        if e not in events:
            events.append(e)
    keys = set().union(*(r.keys() for r in records))
    accuracy_keys = sorted(k for k in keys if k.endswith("accuracy"))
    gpus = sorted(set().union(*(r["gpu_memory"].keys() for r in records
                                if isinstance(r.get("gpu_memory"), dict))))

    panels = [("loss", "loss")]
    if accuracy_keys:
        panels.append(("accuracy", "accuracy"))
    panels.append(("throughput", "samples/s"))
    if "host_rss_bytes" in keys or gpus:
        panels.append(("memory", "MiB"))
    fig, axes = plt.subplots(len(panels), 1, figsize=(9, 2.8 * len(panels)), sharex=True,
                             squeeze=False)
    axes = {name: ax for (name, _), ax in zip(panels, axes[:, 0])}
    for (name, unit) in panels:
        axes[name].set_ylabel(unit)
        axes[name].set_title(name, loc="left", fontsize=10)
        axes[name].grid(True, alpha=0.3)
    starvation_ax = None

    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    many = len(runs) > 1
    curve = 0

    def draw(ax, xs, ys, label, event, run_i):
        nonlocal curve
        if not xs:
            return
        colour = colours[curve % len(colours)]
        curve += 1
        label = f"{label} (run {run_i + 1})" if many else label
        if event == "step":
            # A few points only (a short run): dots too, so that a single one shows.
            ax.plot(xs, ys, color=colour, linewidth=1.2, label=label,
                    marker="." if len(xs) < 30 else None)
        else:
            ax.plot(xs, ys, color=colour, marker="o", markersize=4, linewidth=0.8,
                    linestyle="--", label=label)

    for i, run in enumerate(runs):
        for event in events:
            suffix = "" if event == "step" and len(events) == 1 else f" [{event}]"
            draw(axes["loss"], *series(run, x, "loss", event), "loss" + suffix, event, i)
            for k in accuracy_keys:
                draw(axes["accuracy"], *series(run, x, k, event), k + suffix, event, i)
            draw(axes["throughput"], *series(run, x, "samples_per_s", event),
                 "samples/s" + suffix, event, i)
            sx, sy = series(run, x, "starvation", event)
            if sx and (event == "step" or "step" not in events):
                if starvation_ax is None:
                    starvation_ax = axes["throughput"].twinx()
                    starvation_ax.set_ylabel("starved (%)", color="grey")
                starvation_ax.plot(sx, [100 * v for v in sy], color="grey", linewidth=0.8,
                                   linestyle=":", marker="." if len(sx) < 30 else None,
                                   label="starvation" + suffix)
            if "memory" in axes:
                draw(axes["memory"], *series(run, x, None, event, host_rss),
                     "host RSS" + suffix, event, i)
                for d in gpus:
                    draw(axes["memory"], *series(run, x, None, event, gpu_allocated(d)),
                         f"{d} allocated" + suffix, event, i)

    # Non-finite values: a red dotted line where each was logged.
    panel_of = {"loss": "loss", "samples_per_s": "throughput"}
    panel_of.update({k: "accuracy" for k in accuracy_keys})
    flagged = 0
    for r in records:
        nf = r.get("nonfinite")
        if not isinstance(nf, dict) or number(r.get(x)) is None:
            continue
        for k in nf:
            if k in panel_of:
                axes[panel_of[k]].axvline(r[x], color="red", linestyle=":", linewidth=1,
                                          label="non-finite" if flagged == 0 else None)
                flagged += 1

    for name, ax in axes.items():
        handles, labels = ax.get_legend_handles_labels()
        if name == "throughput" and starvation_ax is not None:
            h2, l2 = starvation_ax.get_legend_handles_labels()
            handles, labels = handles + h2, labels + l2
        if handles:
            ax.legend(handles, labels, fontsize=8, loc="best")
        elif not ax.lines:
            ax.text(0.5, 0.5, "not in the log", transform=ax.transAxes, ha="center",
                    va="center", color="grey")
    axes[panels[-1][0]].set_xlabel({"elapsed_s": "seconds"}.get(x, x))
    fig.suptitle(args.title or os.path.basename(args.log))
    fig.tight_layout()
    try:
        fig.savefig(args.out, dpi=110)
    except OSError as e:
        sys.exit(f"plot-metrics.py: cannot write {args.out}: {e.strerror}")
    counts = ", ".join(f"{sum(r.get('event', 'step') == e for r in records)} {e}"
                       for e in events)
    print(f"wrote {args.out}: {len(records)} lines ({counts}), {len(runs)} run(s), x = {x}"
          + (f", {flagged} non-finite value(s) marked" if flagged else ""))


if __name__ == "__main__":
    main()
