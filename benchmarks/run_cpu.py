#!/usr/bin/env python3
"""Side-by-side CPU benchmarks of galley against PyTorch, libtorch and PaddlePaddle.

Four suites, run by one driver on the same machine, one process per measurement:

throughput  samples/s of a full train step (forward, cross-entropy, backward, Adam, clearing the
            gradients) of each model of models.h ("simple", "fashion", "vgg", "resnet"), for each batch
            size and thread count. Every round runs all frameworks one after the other for each
            cell, their order rotating from round to round; each run reports the median of its
            timed blocks, the table the median over rounds, each framework at its best thread
            count, and galley's throughput divided by each peer's.
tta         time to reach a Fashion-MNIST test accuracy (default 90%) with the same recipe
            (the "fashion" model, Adam 1e-3, batch 64, same normalisation), in galley and in
            each PyTorch, at all cores; training time only, evaluation every --eval-every steps.
amp         the train step in float32 and under bfloat16 autocast (galley's amp::Autocast,
            torch.autocast("cpu", dtype=torch.bfloat16)), galley and each PyTorch, for the models
            of --amp-models at the batches of --amp-batches: cpu-amp.{json,md}, with the goals
            (galley bf16 over galley float32, and over the faster PyTorch bf16).
conv        galley's convolutions, every layer shape of the vgg and resnet models at batch 64
            (bench_kernels' BM_conv2d_layer_*), forward and backward, at each thread count:
            GFLOP/s and `of_peak`, the fraction of the FMA peak that bench_kernels measures; each
            PyTorch's on the same layers (conv_layers_torch.py) in the same rounds, and galley's
            GFLOP/s over the faster one's.

  python3 benchmarks/run_cpu.py --build build                    # all four suites
  python3 benchmarks/run_cpu.py --suite throughput --rounds 1 --models vgg --batches 64
  python3 benchmarks/run_cpu.py --torch-python VENV/bin/python --paddle-python VENV2/bin/python

Outputs under --out (default docs/benchmarks/): cpu-train-step.{json,md,png} and
cpu-time-to-accuracy.{json,md,png} and cpu-conv-layers.{json,md}, each with the machine, versions, date and git commit, and
the tables copied into <out>/README.md between markers.

Other processes competing for the CPU spoil the figures, so before each run the driver waits
(up to --max-wait seconds) for the machine to be idle, measures how many cores other processes
used during the run, and repeats a run that shared the machine (up to --retries times). The
JSON records that background load for every run; medians leave such runs out where a clean
run of the same cell exists.
"""
import argparse
import datetime
import json
import math
import os
import platform
import re
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"
IMPLS = ("galley", "pytorch", "pytorch_alt", "libtorch", "paddle")
LABELS = {"galley": "galley", "pytorch": "PyTorch", "pytorch_alt": "PyTorch", "libtorch": "libtorch",
          "paddle": "Paddle"}
MODELS = ("simple", "fashion", "vgg", "resnet")
MODEL_DESC = {
    "simple": "SimpleCNN [B,3,32,32]: conv 3->64 relu pool | fc 14400->10",
    "fashion": "Fashion-MNIST CNN [B,1,28,28]: conv 1->32 p1 relu pool | conv 32->64 p1 relu pool | "
               "fc 3136->128 relu | fc 10",
    "vgg": "VGG-style [B,3,32,32], 3x3 convs with padding 1: [32, 32, pool] [64, 64, pool] "
           "[128, pool] | fc 2048->10",
    "resnet": "ResNet-20 [B,1,28,28] (examples/resnet.cpp): conv 1->16 BN ReLU | 3 stages of 3 "
              "basic blocks (conv BN ReLU conv BN + shortcut, ReLU) at 16, 32, 64 channels, 1x1 "
              "projections where the shape changes | global avg pool | fc 64->10",
}
# The peers that define each model; a model missing here is defined by all of them.
MODEL_IMPLS = {"resnet": ("galley", "pytorch", "pytorch_alt")}
# Goals, galley over the faster PyTorch: (model, batches, ratio, condition on the CPU or None).
GOALS = [("simple", (64,), 2.0, None), ("fashion", (64,), 2.0, None),
         ("vgg", (64,), 2.0, None), ("vgg", (32, 64, 256), 1.3, "avx512f"),
         ("resnet", (64, 256), 1.5, None)]
# Samples per timed block, so that each block lasts a fraction of a second in galley.
BLOCK_SAMPLES = {"simple": 512, "fashion": 512, "vgg": 128, "resnet": 128}
MARKERS = {"train": ("<!-- cpu-train-step:start -->", "<!-- cpu-train-step:end -->"),
           "conv": ("<!-- cpu-conv-layers:start -->", "<!-- cpu-conv-layers:end -->"),
           "amp": ("<!-- cpu-amp:start -->", "<!-- cpu-amp:end -->"),
           "tta": ("<!-- cpu-time-to-accuracy:start -->", "<!-- cpu-time-to-accuracy:end -->")}


# ----------------------------------------------------------------------------- machine load
def cpu_jiffies():
    """(busy, total) jiffies summed over all CPUs, from /proc/stat."""
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    total = sum(fields[:8])  # guest time is already counted in user
    return total - idle, total


def busy_cores(interval=0.5):
    b0, _ = cpu_jiffies()
    time.sleep(interval)
    b1, _ = cpu_jiffies()
    return (b1 - b0) / os.sysconf("SC_CLK_TCK") / interval


def wait_idle(threshold, max_wait):
    """Waits until fewer than `threshold` cores are busy; returns the last reading."""
    deadline = time.monotonic() + max_wait
    while True:
        load = busy_cores()
        if load < threshold or time.monotonic() >= deadline:
            return load
        time.sleep(1.0)


def child_cpu_seconds():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


# ----------------------------------------------------------------------------- running
def run_one(cmd, env, timeout):
    """Runs a benchmark that prints one JSON object; returns it with the background load."""
    hz = os.sysconf("SC_CLK_TCK")
    b0, _ = cpu_jiffies()
    c0 = child_cpu_seconds()
    t0 = time.monotonic()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=BENCH)
    wall = time.monotonic() - t0
    b1, _ = cpu_jiffies()
    c1 = child_cpu_seconds()
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))} failed ({p.returncode}):\n{p.stderr[-2000:]}")
    line = [l for l in p.stdout.splitlines() if l.strip().startswith("{")][-1]
    res = json.loads(line)
    res["wall_s"] = round(wall, 3)
    # Cores that other processes kept busy while this one ran.
    res["background_cores"] = round(max(0.0, ((b1 - b0) / hz - (c1 - c0)) / wall), 3)
    return res


class Runner:
    """Runs measurements with the idle wait, the contamination check and the reruns."""

    def __init__(self, a):
        self.a = a
        self.spent = 0.0  # seconds of waiting for idle and of reruns

    def __call__(self, cmd, threads, timeout=None, retries=None):
        a = self.a
        env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads),
                   GALLEY_NUM_THREADS=str(threads))
        retries = a.retries if retries is None else retries
        for attempt in range(retries + 1):
            t_wait = time.monotonic()
            idle = wait_idle(a.idle_threshold, min(a.max_wait, max(0.0, a.wait_budget - self.spent)))
            waited = time.monotonic() - t_wait
            self.spent += max(0.0, waited - 0.5)
            res = run_one(cmd, env, timeout or a.timeout)
            res.update(attempt=attempt, idle_before_cores=round(idle, 3), waited_s=round(waited, 1))
            if res["background_cores"] < a.idle_threshold or self.spent >= a.wait_budget:
                break
            self.spent += res["wall_s"]
        return res


def step_command(a, impl, model, batch, threads, amp="off"):
    warmup = 2
    iters = max(1, int(round(BLOCK_SAMPLES[model] * a.scale / batch)))
    if impl == "paddle":
        # Paddle's first steps are very slow (kernel selection) and its steps are 10x slower than
        # the others': more warm-up, less timed work.
        warmup, iters = warmup + 3, max(1, iters // 4)
    common = ["--model", model, "--batch", str(batch), "--threads", str(threads), "--warmup",
              str(warmup), "--iters", str(iters), "--repeats", str(a.repeats), "--json"]
    if amp != "off":
        common += ["--amp", amp]
    if impl == "galley":
        return [str(a.galley_bin)] + common
    if impl == "libtorch":
        return [str(a.libtorch_bin)] + common
    if impl == "paddle":
        return [a.paddle_python, str(BENCH / "train_step_paddle.py")] + common
    return [a.pythons[impl], str(BENCH / "train_step_torch.py")] + common


def tta_command(a, impl, threads, seed=0):
    common = ["--threads", str(threads), "--target", str(a.target), "--epochs", str(a.tta_epochs),
              "--eval-every", str(a.eval_every), "--seed", str(seed), "--json"]
    if a.data:
        common += ["--data", a.data]
    if impl == "galley":
        return [str(a.tta_bin)] + common
    return [a.pythons[impl], str(BENCH / "time_to_accuracy_torch.py")] + common


def find_binary(build_dirs, name):
    for d in build_dirs:
        for p in (Path(d) / "benchmarks" / name, Path(d) / name):
            if p.is_file() and os.access(p, os.X_OK):
                return p.resolve()  # the programs run from benchmarks/
    return None


def python_has(python, module):
    try:
        return subprocess.run([python, "-c", f"import {module}"], capture_output=True,
                              timeout=120).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


# ----------------------------------------------------------------------------- metadata
def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_flags():
    """The SIMD flags of /proc/cpuinfo that decide which kernels run (avx2, fma, avx512*, amx*)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return sorted(v for v in line.split(":", 1)[1].split()
                                  if v in ("avx2", "fma", "f16c") or v.startswith(("avx512", "amx")))
    except OSError:
        pass
    return []


def git(*args):
    try:
        return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True,
                              timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def compiler_version():
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if not cxx:
        return ""
    try:
        return subprocess.run([cxx, "--version"], capture_output=True, text=True,
                              timeout=10).stdout.splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return ""


def metadata(a, benchmark, impls, runs, commit, dirty, t_start):
    versions = {i: next((r["version"] for r in runs if r["impl"] == i), None) for i in impls}
    versions["python"] = platform.python_version()
    versions["compiler"] = compiler_version()
    return {
        "benchmark": benchmark,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "git_commit": commit,
        "git_dirty": dirty,
        "machine": {
            "cpu_model": cpu_model(),
            "logical_cpus": os.cpu_count(),
            "usable_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
            "kernel": platform.release(),
            "arch": platform.machine(),
            "cpu_flags": cpu_flags(),
        },
        "versions": versions,
        "runtime_s": round(time.monotonic() - t_start, 1),
    }


def label(impl, versions):
    v = versions.get(impl) or ""
    if impl in ("pytorch", "pytorch_alt") and v:
        return f"PyTorch {'.'.join(v.split('+')[0].split('.')[:2])}"
    return LABELS[impl]


def header(meta):
    v = meta["versions"]
    peers = ", ".join(f"{LABELS[i]} {v[i]}" for i in IMPLS if i != "galley" and v.get(i))
    return (f"CPU: {meta['machine']['cpu_model']}, {meta['machine']['logical_cpus']} logical CPUs. "
            f"{meta['date']}, galley {v.get('galley') or '?'} at "
            f"{meta['git_commit'][:12] or 'unknown commit'}{' (modified)' if meta.get('git_dirty') else ''}"
            + (f"; {peers}." if peers else "."))


# ----------------------------------------------------------------------------- throughput report
def fmt(v):
    return f"{v:,.0f}" if v is not None else "n/a"


def summarise(runs, impls, models, batches, threads, idle_threshold):
    """median over rounds per (impl, model, batch, threads), then each impl's best thread count.

    Runs that shared the CPU with other processes count only when a cell has no other run."""
    med, shared = {}, set()
    for impl in impls:
        for m in models:
            for b in batches:
                for t in threads:
                    cell = [r for r in runs if (r["impl"], r["model"], r["batch"], r["threads"]) == (impl, m, b, t)]
                    clean = [r for r in cell if r["background_cores"] < idle_threshold]
                    if cell and not clean:
                        shared.add((impl, m, b, t))
                    vals = [r["samples_per_s"] for r in (clean or cell)]
                    if vals:
                        med[(impl, m, b, t)] = statistics.median(vals)
    best = {}
    for impl in impls:
        for m in models:
            for b in batches:
                cands = [(med[(impl, m, b, t)], t) for t in threads if (impl, m, b, t) in med]
                if cands:
                    v, t = max(cands)
                    best[(impl, m, b)] = {"samples_per_s": v, "threads": t,
                                          "shared_cpu": (impl, m, b, t) in shared}
    return med, best, shared


def train_markdown(meta, med, best, shared, impls, models, batches, threads):
    v = meta["versions"]
    peers = [i for i in impls if i != "galley"]
    rounds = meta["rounds"]
    lines = [
        "Train step (forward, cross-entropy, backward, Adam, zero grad), float32. " + header(meta),
        "",
        "Samples per second, higher is better; each framework at its best thread count (in "
        f"brackets); median of {rounds} rounds"
        + (f" ({meta['paddle_rounds']} for Paddle, at batch {', '.join(map(str, meta.get('paddle_batches', [])))} only)"
           if "paddle" in impls and meta.get("paddle_rounds", rounds) < rounds else "")
        + ". The last columns divide galley's figure by each peer's."
        + (f" {meta['shared_cpu_runs']} of {meta['n_runs']} runs shared the CPU with other "
           "processes (`background_cores` in the JSON); medians leave them out where a "
           "clean run exists, and cells marked * have none." if meta.get("shared_cpu_runs") else ""),
        "",
        "| model | batch | " + " | ".join(label(i, v) for i in impls) + " | "
        + " | ".join(f"÷ {label(p, v)}" for p in peers) + " |",
        "|---|---:|" + "---:|" * (len(impls) + len(peers)),
    ]
    for m in models:
        for b in batches:
            cells = []
            for i in impls:
                e = best.get((i, m, b))
                cells.append(f"{fmt(e['samples_per_s'])} ({e['threads']}T){'*' if e['shared_cpu'] else ''}"
                             if e else "n/a")
            g = best.get(("galley", m, b))
            ratios = [f"{g['samples_per_s'] / best[(p, m, b)]['samples_per_s']:.2f}x"
                      if g and (p, m, b) in best else "n/a" for p in peers]
            lines.append(f"| {m} | {b} | " + " | ".join(cells + ratios) + " |")
    torches = [p for p in peers if p.startswith("pytorch")]
    goal_lines = []
    for m, goal_batches, goal, needs in GOALS:
        for b in goal_batches:
            g = best.get(("galley", m, b))
            pv = [best[(p, m, b)]["samples_per_s"] for p in torches if (p, m, b) in best]
            if m not in models or b not in batches or not g or not pv:
                continue
            r = g["samples_per_s"] / max(pv)
            verdict = "met" if r >= goal else "not met"
            if needs and needs not in meta["machine"].get("cpu_flags", []):
                verdict = f"not applicable here (the goal is for CPUs with {needs})"
            goal_lines.append(f"- {m}, batch {b}: {r:.2f}x, goal ≥ {goal:g}x — {verdict}")
    if goal_lines:
        lines += ["", "Goals, galley over the faster PyTorch:", ""] + goal_lines
    lines += ["", "Models:", ""] + [f"- `{m}`: {MODEL_DESC[m]}" for m in models]
    lines += ["", "All thread counts (samples/s, median over rounds):", "",
              "| model | batch | threads | " + " | ".join(label(i, v) for i in impls) + " |",
              "|---|---:|---:|" + "---:|" * len(impls)]
    for m in models:
        for b in batches:
            for t in threads:
                lines.append(f"| {m} | {b} | {t} | " + " | ".join(
                    fmt(med.get((i, m, b, t))) + ("*" if (i, m, b, t) in shared else "") for i in impls) + " |")
    return "\n".join(lines) + "\n"


def train_plot(path, meta, best, impls, models, batches):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("note: matplotlib not importable, no plot", file=sys.stderr)
        return False
    v = meta["versions"]
    fig, axes = plt.subplots(1, len(models), figsize=(4.2 * len(models), 4), squeeze=False)
    width = 0.8 / len(impls)
    for ax, m in zip(axes[0], models):
        for k, i in enumerate(impls):
            ys = [best.get((i, m, b), {}).get("samples_per_s", 0) for b in batches]
            xs = [j + (k - (len(impls) - 1) / 2) * width for j in range(len(batches))]
            ax.bar(xs, ys, width, label=label(i, v))
        # galley's ratio to the faster PyTorch above its bar.
        torches = [p for p in impls if p.startswith("pytorch")]
        if "galley" in impls and torches:
            k = impls.index("galley")
            for j, b in enumerate(batches):
                g = best.get(("galley", m, b))
                pv = [best[(p, m, b)]["samples_per_s"] for p in torches if (p, m, b) in best]
                if g and pv:
                    ax.annotate(f"{g['samples_per_s'] / max(pv):.1f}x",
                                (j + (k - (len(impls) - 1) / 2) * width, g["samples_per_s"]),
                                ha="center", va="bottom", fontsize=7)
        ax.set_xticks(range(len(batches)), [str(b) for b in batches])
        ax.set_xlabel("batch")
        ax.set_title(m)
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].set_ylabel("samples/s (each at its best thread count)")
    handles, names = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, names, loc="lower left", ncol=len(impls), fontsize=8, frameon=False)
    fig.text(0.99, 0.015, "above galley's bars: galley / the faster PyTorch", ha="right", fontsize=8)
    fig.suptitle(f"CPU train-step throughput, {meta['machine']['cpu_model']} x{meta['machine']['logical_cpus']}, "
                 f"{meta['date']}, galley {meta['git_commit'][:10]}", fontsize=9)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def update_readme(path, which, table):
    start, end = MARKERS[which]
    if not path.is_file():
        return False
    text = path.read_text()
    pat = re.compile(re.escape(start) + r".*?" + re.escape(end), re.S)
    if not pat.search(text):
        return False
    path.write_text(pat.sub(lambda _: f"{start}\n{table}{end}", text))
    return True


def report_train(a, meta, runs, impls, models, batches, threads):
    meta["n_runs"] = len(runs)
    meta["shared_cpu_runs"] = sum(r["background_cores"] >= a.idle_threshold for r in runs)
    meta["idle_threshold_cores"] = a.idle_threshold
    med, best, shared = summarise(runs, impls, models, batches, threads, a.idle_threshold)
    table = train_markdown(meta, med, best, shared, impls, models, batches, threads)
    summary = []
    for m in models:
        for b in batches:
            row = {"model": m, "batch": b}
            g = best.get(("galley", m, b))
            for i in impls:
                row[i] = best.get((i, m, b))
                row[i + "_by_threads"] = {str(t): med.get((i, m, b, t)) for t in threads}
                if i != "galley" and g and (i, m, b) in best:
                    row[f"galley_over_{i}"] = g["samples_per_s"] / best[(i, m, b)]["samples_per_s"]
            summary.append(row)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "cpu-train-step.json").write_text(
        json.dumps({**meta, "models": models, "batches": batches, "threads": threads,
                    "summary": summary, "runs": runs}, indent=2) + "\n")
    (a.out / "cpu-train-step.md").write_text(table)
    train_plot(a.out / "cpu-train-step.png", meta, best, impls, models, batches)
    if not a.no_readme and update_readme(a.out / "README.md", "train", table):
        print(f"updated {a.out / 'README.md'}")
    print()
    print(table)
    print(f"wrote {a.out}/cpu-train-step.{{json,md,png}} ({meta['runtime_s']} s)")


# ----------------------------------------------------------------------------- tta report
def tta_markdown(meta, runs, impls):
    v = meta["versions"]
    seeds = meta.get("seeds", [0])

    def summary(impl):
        rs = [x for x in runs if x["impl"] == impl]
        if not rs:
            return None
        reached = [x for x in rs if x["reached"]]
        return {
            "runs": rs,
            "reached": len(reached),
            # A run that missed the target counts as slower than every run that reached it.
            "time": statistics.median([x["time_s"] if x["reached"] else math.inf for x in rs]),
            "steps": statistics.median([x["steps"] for x in rs]),
            "epochs": statistics.median([x["epochs"] for x in rs]),
            "rate": statistics.median([x["steps"] * 64 / x["train_s"] for x in rs if x["train_s"]]),
            "best": statistics.median([x["best_accuracy"] for x in rs]),
        }

    g = summary("galley")
    lines = [
        f"Time to {100 * meta['target']:.0f}% Fashion-MNIST test accuracy: the `fashion` model, Adam "
        f"(lr 1e-3), batch 64, images normalised with mean 0.2860 / std 0.3530, a fresh shuffle "
        f"each epoch, at most {meta['epochs']} epochs, test accuracy measured every "
        f"{meta['eval_every']} steps and at each epoch's end; {meta['threads']} "
        f"thread{'s' if meta['threads'] != 1 else ''}. Time is training only (evaluation excluded). "
        f"Each framework ran with seeds {', '.join(str(x) for x in seeds)} (initial weights and "
        f"data order); the table gives medians over seeds, a run that missed the target counting "
        f"as slowest. Runs count as clean when other processes kept fewer than "
        f"{meta['idle_threshold_cores']} cores busy. " + header(meta),
        "",
        "| framework | median time to target | median steps (epochs) | samples/s while training | median best accuracy | galley ÷ peer time |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for i in impls:
        r = summary(i)
        if not r:
            continue
        t = f"{r['time']:.1f} s" if math.isfinite(r["time"]) else "not reached"
        if r["reached"] < len(r["runs"]):
            t += f" ({r['reached']}/{len(r['runs'])} reached)"
        ratio = ""
        if i != "galley":
            ok = g and math.isfinite(g["time"]) and math.isfinite(r["time"])
            ratio = f"{g['time'] / r['time']:.2f}x" if ok else "n/a"
        flag = "*" if any(x["background_cores"] >= meta["idle_threshold_cores"] for x in r["runs"]) else ""
        lines.append(f"| {label(i, v)} | {t}{flag} | {r['steps']:.0f} ({r['epochs']:.2f}) | "
                     f"{fmt(r['rate'])} | {100 * r['best']:.2f}% | {ratio} |")
    if len(seeds) > 1:
        lines += ["", "Per seed (time to target, steps):", "",
                  "| framework | " + " | ".join(f"seed {x}" for x in seeds) + " |",
                  "|---|" + "---:|" * len(seeds)]
        for i in impls:
            cells = []
            for sd in seeds:
                x = next((x for x in runs if x["impl"] == i and x.get("seed", 0) == sd), None)
                if not x:
                    cells.append("-")
                elif x["reached"]:
                    cells.append(f"{x['time_s']:.1f} s, {x['steps']}")
                else:
                    cells.append(f"not reached, {x['steps']}")
            lines.append(f"| {label(i, v)} | " + " | ".join(cells) + " |")
    lines += ["", "Goal: galley's time ≤ 0.5x PyTorch's. The steps a run needs depend on its seed's "
              "initial weights and data order (each framework has its own random streams), which is "
              "why the medians over several seeds are compared; the samples/s column compares speed "
              "alone."]
    if any(r["background_cores"] >= meta["idle_threshold_cores"] for r in runs):
        lines += ["", "\\* a run shared the CPU with other processes (see `background_cores` in the JSON)."]
    return "\n".join(lines) + "\n"


def tta_plot(path, meta, runs, impls):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    v = meta["versions"]
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for i in impls:  # the first seed's curves
        r = next((x for x in runs if x["impl"] == i), None)
        if r:
            ax.plot([e["train_s"] for e in r["evals"]], [100 * e["accuracy"] for e in r["evals"]],
                    marker="o", ms=3, label=f"{label(i, v)} (seed {r.get('seed', 0)})")
    ax.axhline(100 * meta["target"], color="grey", ls="--", lw=1)
    ax.set_xlabel("training time (s)")
    ax.set_ylabel("Fashion-MNIST test accuracy (%)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"Time to accuracy, {meta['threads']} thread{'s' if meta['threads'] != 1 else ''}, "
                 f"{meta['date']}, galley "
                 f"{meta['git_commit'][:10]}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def report_tta(a, meta, runs, impls):
    meta["idle_threshold_cores"] = a.idle_threshold
    table = tta_markdown(meta, runs, impls)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "cpu-time-to-accuracy.json").write_text(json.dumps({**meta, "runs": runs}, indent=2) + "\n")
    (a.out / "cpu-time-to-accuracy.md").write_text(table)
    tta_plot(a.out / "cpu-time-to-accuracy.png", meta, runs, impls)
    if not a.no_readme and update_readme(a.out / "README.md", "tta", table):
        print(f"updated {a.out / 'README.md'}")
    print()
    print(table)
    print(f"wrote {a.out}/cpu-time-to-accuracy.{{json,md,png}} ({meta['runtime_s']} s)")


# ----------------------------------------------------------------------------- conv layers
CONV_GOAL = 0.75  # of the measured FMA peak
CONV_TORCHES = ("pytorch", "pytorch_alt")  # timed on the same layers by conv_layers_torch.py


def conv_pass(bench_name, counters):
    """The pass a BM_conv2d_layer_* figure times: a stem's backward is its weight gradient alone
    (the model's input takes none)."""
    if "forward" in bench_name:
        return "forward"
    return "backward" if counters.get("input_grad", 1) else "backward (weights)"


def conv_layer_spec(row):
    """conv_layers_torch.py's description of a row's layer, from bench_kernels' label."""
    m = re.fullmatch(r"(\d+)->(\d+) (\d+)x\d+/(\d+) (\d+)x\d+", row["layer"])
    cin, cout, k, stride, hw = (int(v) for v in m.groups())
    return {"key": row["key"], "in": cin, "out": cout, "k": k, "stride": stride, "hw": hw,
            "bias": row["bias"], "pass": row["pass"]}


def conv_torch(e):
    """The faster PyTorch's figures of a row's thread count, and its label; (None, None) without."""
    ts = e.get("torch") or {}
    if not ts:
        return None, None
    name = max(ts, key=lambda i: ts[i]["gflops"])
    return ts[name], name


def conv_markdown(meta, rows, threads):
    v = meta["versions"]
    torches = [i for i in CONV_TORCHES if v.get(i)]
    if torches:
        how = ("against PyTorch's on the same layers (`benchmarks/conv_layers_torch.py`: "
               "`torch.nn.functional.conv2d`, NCHW, its oneDNN kernels). ")
        runs = (f"{meta['repetitions']} rounds; each runs every layer once in galley, then in each "
                "PyTorch (the order of the frameworks rotating, of the layers shuffled); the table "
                "gives the median over rounds. ")
        theirs = (" `PyTorch`: the faster of " + ", ".join(label(i, v) for i in torches)
                  + " at that thread count, and `vs PyTorch` galley's GFLOP/s over its.")
    else:  # a run of galley alone (the suite before PyTorch ran beside it)
        how, theirs = "", ""
        runs = f"The median of {meta['repetitions']} repetitions. "
    # (`best`: in the runs that kept each round's or repetition's figures)
    has_best = any("best_of_peak" in e for r in rows for e in r["by_threads"].values())
    has_roof = any("roofline" in e for r in rows for e in r["by_threads"].values())
    per_t = (["GFLOP/s", "of_peak"] + (["best"] if has_best else [])
             + (["roofline"] if has_roof else [])
             + (["PyTorch of_peak", "vs PyTorch"] if torches else []))
    lines = [
        "galley's convolutions, float32, batch 64, every layer shape of the `vgg` and `resnet` "
        "models (`bench_kernels --benchmark_filter='conv2d_layer.*/bf16:0'`)" + (", " if how else ". ")
        + how + "Backward: the gradients the model's step computes; a stem's input is "
        "the data, so its backward is the weight gradient alone (`backward (weights)`). "
        + runs + header(meta),
        "",
        "`of_peak`: GFLOP/s over the FMA peak that bench_kernels measures at start-up for the same "
        "thread count (" + ", ".join(f"{t} thread{'s' if t > 1 else ''}: {meta['peak_gflops'][str(t)]:.0f} GFLOP/s"
                                     for t in threads) + ")" + (", for galley and PyTorch alike" if torches else "")
        + f". Goal: ≥ {CONV_GOAL:.0%} of peak, on the median."
        + ((" `best`: galley's fastest " + ("round" if torches else "repetition")
            + "; where it stands well above the median, the machine's speed moved during the run.")
           if has_best else "")
        + (" `roofline`: the layer's memory bound as a fraction of the peak: the pass's flops over "
           "the bytes of the tensors it reads and writes once each, times the copy bandwidth "
           "bench_kernels measures at start-up for arrays far larger than the caches (" + ", ".join(
               f"{t} thread{'s' if t > 1 else ''}: {meta['peak_gbs'][str(t)]:.0f} GB/s" for t in threads)
           + "; bytes read plus bytes written). Below 1 the layer is memory-bound when its tensors "
           "come from memory, and no kernel of its own passes that fraction of the peak (only a "
           "fusion that keeps them in the caches between layers); above 1 it is compute-bound. "
           "The benchmark reruns the same tensors, which may stay in the last-level cache, so a "
           "layer can run above its bound here."
           if has_roof else "") + theirs,
        "",
        "| model | layer (in->out kxk/stride, input) | pass | "
        + " | ".join(f"{t}T {c}" for t in threads for c in per_t) + " |",
        "|---|---|---|" + "---:|" * (len(per_t) * len(threads)),
    ]
    for r in rows:
        cells = []
        for t in threads:
            e = r["by_threads"].get(str(t))
            if not e:
                cells += ["n/a"] * len(per_t)
                continue
            cells += [f"{e['gflops']:.1f}", f"{e['of_peak']:.2f}"]
            if has_best:
                cells.append(f"{e['best_of_peak']:.2f}" if "best_of_peak" in e else "n/a")
            if has_roof:
                cells.append(f"{e['roofline']:.2f}" if "roofline" in e else "n/a")
            if torches:
                tf, name = conv_torch(e)
                cells += ([f"{tf['of_peak']:.2f} ({label(name, v).split(' ')[-1]})",
                           f"{e['gflops'] / tf['gflops']:.2f}x"] if tf else ["n/a", "n/a"])
        lines.append(f"| {r['model']} | {r['layer']} | {r['pass']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def run_conv(a, impls, threads, commit, dirty):
    """Per-layer convolutions at each thread count, galley's (bench_kernels) and each PyTorch's
    (conv_layers_torch.py) in alternating rounds; writes cpu-conv-layers.*"""
    t_start = time.monotonic()
    torches = [i for i in impls if i in CONV_TORCHES]
    rows, peaks, gbs, runs, versions = {}, {}, {}, [], {"galley": a.galley_version}
    a.out.mkdir(parents=True, exist_ok=True)
    scratch = Path(a.out) / ".conv-layers.json"
    for t in threads:
        env = dict(os.environ, OMP_NUM_THREADS=str(t), MKL_NUM_THREADS=str(t), GALLEY_NUM_THREADS=str(t))
        round_peaks, round_gbs = [], []
        for rnd in range(a.conv_repetitions):
            order = ["galley"] + torches
            order = order[rnd % len(order):] + order[:rnd % len(order)]
            for impl in order:
                wait_idle(a.idle_threshold, a.max_wait)
                if impl == "galley":
                    # float32 only: the layers' bfloat16 variants (bf16:1) have the goals of the amp
                    # suite. The layers in an order of their own each round.
                    cmd = [str(a.kernels_bin), f"--threads={t}", "--benchmark_filter=conv2d_layer.*/bf16:0",
                           "--benchmark_min_time=0.5", "--benchmark_enable_random_interleaving=true",
                           f"--benchmark_out={scratch}", "--benchmark_out_format=json"]
                    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800, cwd=BENCH)
                    if p.returncode != 0:
                        raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stderr[-2000:]}")
                    d = json.loads(scratch.read_text())
                    round_peaks.append(float(d["context"]["peak_fp32_gflops"]))
                    round_gbs.append(float(d["context"]["peak_copy_gbs"]))
                    for b in d["benchmarks"]:
                        if b.get("run_type") != "iteration":
                            continue
                        name = b["name"].split("/")[0]
                        model, layer = b["label"].split(" ", 1)
                        what = conv_pass(name, b)
                        key = f"{what}|{b['label']}"
                        secs = b["real_time"] * {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}[b["time_unit"]]
                        r = rows.setdefault(key, {
                            "key": key, "model": model, "layer": layer, "pass": what,
                            "bias": int(b.get("bias", 0)), "flops": b["GFLOP/s"] * 1e9 * secs,
                            "shape": int(re.search(r"/shape:(\d+)", b["name"]).group(1)), "rounds": {}})
                        r["rounds"].setdefault(str(t), {}).setdefault("galley", []).append(
                            {"gflops": b["GFLOP/s"], "of_peak": b["of_peak"],
                             **({"roofline": b["roofline"]} if "roofline" in b else {})})
                        runs.append({"impl": "galley", "version": a.galley_version, "threads": t,
                                     "round": rnd, "name": b["name"], "label": b["label"],
                                     "GFLOP/s": b["GFLOP/s"], "of_peak": b["of_peak"]})
                    scratch.unlink()
                    continue
                if not rows:  # the layers come from galley's first round
                    continue
                scratch.write_text(json.dumps([conv_layer_spec(r) for r in rows.values()]))
                cmd = [a.pythons[impl], str(BENCH / "conv_layers_torch.py"), "--layers", str(scratch),
                       "--threads", str(t), "--min-time", "0.5", "--seed", str(rnd)]
                p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800, cwd=BENCH)
                scratch.unlink()
                if p.returncode != 0:
                    raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stderr[-2000:]}")
                d = json.loads(p.stdout.strip().splitlines()[-1])
                versions[impl] = d["version"]
                for key, secs in d["seconds"].items():
                    gflops = rows[key]["flops"] / secs / 1e9
                    # over the peak bench_kernels measured in this round, as galley's of_peak
                    rows[key]["rounds"].setdefault(str(t), {}).setdefault(impl, []).append(
                        {"gflops": gflops, "of_peak": gflops / round_peaks[-1]})
                    runs.append({"impl": impl, "version": d["version"], "threads": t, "round": rnd,
                                 "key": key, "seconds": secs})
            print(f"conv layers, {t} thread(s), round {rnd + 1}/{a.conv_repetitions} done", flush=True)
        peaks[str(t)] = statistics.median(round_peaks)
        gbs[str(t)] = statistics.median(round_gbs)
        for r in rows.values():
            by = r["rounds"].get(str(t), {})
            if not by.get("galley"):
                continue
            g = by["galley"]
            e = {"gflops": statistics.median(x["gflops"] for x in g),
                 "of_peak": statistics.median(x["of_peak"] for x in g),
                 "best_of_peak": max(x["of_peak"] for x in g), "torch": {}}
            if all("roofline" in x for x in g):
                e["roofline"] = statistics.median(x["roofline"] for x in g)
            for impl in torches:
                if by.get(impl):
                    e["torch"][impl] = {"gflops": statistics.median(x["gflops"] for x in by[impl]),
                                        "of_peak": statistics.median(x["of_peak"] for x in by[impl])}
            r.setdefault("by_threads", {})[str(t)] = e
    meta = metadata(a, "cpu-conv-layers", ["galley"] + torches,
                    [{"impl": i, "version": v} for i, v in versions.items()], commit, dirty, t_start)
    meta.update(repetitions=a.conv_repetitions, peak_gflops=peaks, peak_gbs=gbs, threads=threads,
                goal_of_peak=CONV_GOAL)
    # (the layers come in random order: the table keeps bench_kernels' order of the shapes)
    ordered = sorted(rows.values(),
                     key=lambda r: (r["model"] != "vgg", not r["pass"].startswith("forward"), r["shape"]))
    for r in ordered:
        r.pop("rounds", None)
    (a.out / "cpu-conv-layers.json").write_text(json.dumps({**meta, "layers": ordered, "runs": runs}, indent=2) + "\n")
    report_conv(a, meta, ordered, threads)


def report_conv(a, meta, layers, threads):
    """cpu-conv-layers.md (and the README's table) from a run's layers, in their order."""
    table = conv_markdown(meta, layers, threads)
    (a.out / "cpu-conv-layers.md").write_text(table)
    if not a.no_readme and update_readme(a.out / "README.md", "conv", table):
        print(f"updated {a.out / 'README.md'}")
    print()
    print(table)


# ----------------------------------------------------------------------------- amp
# Goals of bfloat16 autocast, on a CPU with AVX512-BF16: galley bf16 over galley float32, and over
# the faster PyTorch bf16.
AMP_GOALS = {"over_float32": 1.5, "over_pytorch": 2.0, "cpu_flag": "avx512_bf16"}
AMP_IMPLS = ("galley", "pytorch", "pytorch_alt")


def amp_markdown(meta, best, variants, models, batches):
    v = meta["versions"]
    names = {f"{i}|{amp}": f"{label(i, v)} {'bf16' if amp == 'bf16' else 'fp32'}" for i in AMP_IMPLS
             for amp in ("off", "bf16")}
    has_flag = AMP_GOALS["cpu_flag"] in meta["machine"]["cpu_flags"]
    lines = [
        "Train step (forward and loss under bfloat16 autocast, backward, Adam, zero grad) against "
        "the float32 step. " + header(meta),
        "",
        f"Samples per second, each at its best thread count (in brackets), median of {meta['rounds']} "
        "rounds. Goals on a CPU with AVX512-BF16: galley bf16 ≥ "
        f"{AMP_GOALS['over_float32']}x galley fp32 and ≥ {AMP_GOALS['over_pytorch']}x the faster PyTorch "
        "bf16. " + ("This CPU has AVX512-BF16." if has_flag else
                    "This CPU has no AVX512-BF16, so the goals do not apply here: galley's "
                    "bfloat16 convolutions widen their 16-bit activations inside the kernels and "
                    "compute with float32 FMAs (matmul and linear widen a copy), so bfloat16 "
                    "saves memory traffic but no arithmetic; the figures show what that "
                    "fallback costs or gains."),
        "",
        "| model | batch | " + " | ".join(names[x] for x in variants)
        + " | galley bf16 / fp32 | galley bf16 / best PyTorch bf16 |",
        "|---|---:|" + "---:|" * (len(variants) + 2),
    ]
    for m in models:
        for b in batches:
            cells = []
            for x in variants:
                e = best.get((x, m, b))
                cells.append(f"{fmt(e['samples_per_s'])} ({e['threads']})" if e else "n/a")
            g16, g32 = best.get(("galley|bf16", m, b)), best.get(("galley|off", m, b))
            t16 = [best[(x, m, b)]["samples_per_s"] for x in variants
                   if x.startswith("pytorch") and x.endswith("|bf16") and (x, m, b) in best]
            r1 = f"{g16['samples_per_s'] / g32['samples_per_s']:.2f}x" if g16 and g32 else "n/a"
            r2 = f"{g16['samples_per_s'] / max(t16):.2f}x" if g16 and t16 else "n/a"
            lines.append(f"| {m} | {b} | " + " | ".join(cells) + f" | {r1} | {r2} |")
    return "\n".join(lines) + "\n"


def run_amp(a, runner, impls, threads, commit, dirty):
    """float32 and bf16 autocast steps of galley and each PyTorch; writes cpu-amp.{json,md}"""
    t_start = time.monotonic()
    models = [m for m in a.amp_models.split(",") if m]
    batches = [int(v) for v in a.amp_batches.split(",") if v]
    variants = [f"{i}|{amp}" for i in impls if i in AMP_IMPLS for amp in ("off", "bf16")]
    runs = []
    n_total, k = a.rounds * len(models) * len(batches) * len(threads) * len(variants), 0
    for rnd in range(a.rounds):
        for m in models:
            for b in batches:
                for t in threads:
                    order = variants[rnd % len(variants):] + variants[:rnd % len(variants)]
                    for x in order:
                        impl, amp = x.split("|")
                        k += 1
                        res = runner(step_command(a, impl, m, b, t, amp), t)
                        res.update(impl=impl, amp=amp, model=m, round=rnd)
                        runs.append(res)
                        flag = "  (shared CPU)" if res["background_cores"] >= a.idle_threshold else ""
                        print(f"[{k:3d}/{n_total}] round {rnd} {m:7s} batch {b:4d} threads {t} "
                              f"{impl:11s} {amp:4s}{res['samples_per_s']:10.1f} samples/s{flag}", flush=True)
    meta = metadata(a, "cpu-amp", [i for i in impls if i in AMP_IMPLS], runs, commit, dirty, t_start)
    meta.update(rounds=a.rounds, repeats_per_run=a.repeats, goals=AMP_GOALS)
    report_amp(a, meta, runs, models, batches, threads)


def report_amp(a, meta, runs, models, batches, threads):
    """cpu-amp.{json,md} (and the README's table) from the runs of run_amp."""
    variants = [f"{i}|{amp}" for i in AMP_IMPLS for amp in ("off", "bf16")
                if any(r["impl"] == i and r["amp"] == amp for r in runs)]
    keyed = [dict(r, impl=f"{r['impl']}|{r['amp']}") for r in runs]
    _, best, _ = summarise(keyed, variants, models, batches, threads, a.idle_threshold)
    table = amp_markdown(meta, best, variants, models, batches)
    summary = [{"variant": x, "model": m, "batch": b, **best[(x, m, b)]}
               for x in variants for m in models for b in batches if (x, m, b) in best]
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "cpu-amp.json").write_text(
        json.dumps({**meta, "models": models, "batches": batches, "threads": threads,
                    "summary": summary, "runs": runs}, indent=2) + "\n")
    (a.out / "cpu-amp.md").write_text(table)
    if not a.no_readme and update_readme(a.out / "README.md", "amp", table):
        print(f"updated {a.out / 'README.md'}")
    print()
    print(table)


# ----------------------------------------------------------------------------- main
def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--suite", default="throughput,tta,conv,amp",
                    help="throughput, tta, conv, amp, or a list")
    ap.add_argument("--amp-models", default="vgg,resnet", help="amp suite: models")
    ap.add_argument("--amp-batches", default="64", help="amp suite: batch sizes")
    ap.add_argument("--conv-repetitions", type=int, default=5,
                    help="conv suite: rounds (every layer once per framework a round)")
    ap.add_argument("--build", action="append", default=None,
                    help="build folder(s) holding benchmarks/bench_* (default: build, build-bench)")
    ap.add_argument("--python", default="/usr/bin/python3" if Path("/usr/bin/python3").exists()
                    else sys.executable, help="Python with torch (the 'pytorch' peer)")
    ap.add_argument("--torch-python", help="a second Python with another torch (the 'pytorch_alt' peer)")
    ap.add_argument("--paddle-python", help="Python with paddlepaddle (the 'paddle' peer)")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--batches", default="32,64,256")
    ap.add_argument("--threads", default=f"1,{os.cpu_count()}" if os.cpu_count() > 1 else "1")
    ap.add_argument("--impls", default=",".join(IMPLS), help="those missing are left out with a note")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--paddle-rounds", type=int, default=1,
                    help="rounds that include Paddle (its steps are slow)")
    ap.add_argument("--paddle-batches", default="64", help="batch sizes that include Paddle")
    ap.add_argument("--repeats", type=int, default=3, help="timed blocks inside each run")
    ap.add_argument("--scale", type=float, default=1.0, help="multiplies the steps per timed block")
    ap.add_argument("--target", type=float, default=0.9, help="time-to-accuracy target")
    ap.add_argument("--tta-epochs", type=int, default=3, help="time-to-accuracy: most epochs")
    ap.add_argument("--eval-every", type=int, default=235, help="time-to-accuracy: steps between evaluations")
    ap.add_argument("--tta-threads", type=int, default=os.cpu_count())
    ap.add_argument("--tta-seeds", default="0,1,2,3",
                    help="time-to-accuracy: seeds run by every framework (medians are reported)")
    ap.add_argument("--data", help="Fashion-MNIST folder (default: each program's default)")
    ap.add_argument("--idle-threshold", type=float, default=0.2,
                    help="busy cores below which the machine counts as idle")
    ap.add_argument("--max-wait", type=float, default=20.0, help="seconds to wait for idle per run")
    ap.add_argument("--wait-budget", type=float, default=90.0,
                    help="seconds of waiting and reruns for the whole session; then run regardless")
    ap.add_argument("--retries", type=int, default=2, help="reruns of a run that shared the CPU")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per run")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks")
    ap.add_argument("--git-commit", default="",
                    help="commit to record, when the binaries were built from an export of it "
                         "rather than from this checkout")
    ap.add_argument("--no-readme", action="store_true", help="do not refresh the tables in <out>/README.md")
    ap.add_argument("--from-json", type=Path, action="append",
                    help="rebuild tables and plots from a JSON written earlier instead of running")
    a = ap.parse_args()

    if a.from_json:
        for path in a.from_json:
            d = json.loads(path.read_text())
            runs = d["runs"]
            a.idle_threshold = d.get("idle_threshold_cores", a.idle_threshold)
            if d["benchmark"] == "cpu-conv-layers":  # galley's kernels alone: no "impl" in its runs
                a.out.mkdir(parents=True, exist_ok=True)
                meta = {k: v for k, v in d.items() if k not in ("layers", "runs")}
                report_conv(a, meta, d["layers"], d["threads"])
                continue
            impls = [i for i in IMPLS if any(r["impl"] == i for r in runs)]
            if d["benchmark"] == "cpu-amp":
                meta = {k: v for k, v in d.items() if k not in ("summary", "runs", "models", "batches", "threads")}
                report_amp(a, meta, runs, d["models"], d["batches"], d["threads"])
            elif d["benchmark"] == "cpu-train-step":
                meta = {k: v for k, v in d.items() if k not in ("summary", "runs", "models", "batches", "threads")}
                report_train(a, meta, runs, impls, d["models"], d["batches"], d["threads"])
            else:
                meta = {k: v for k, v in d.items() if k != "runs"}
                report_tta(a, meta, runs, impls)
        return 0

    suites = [s for s in a.suite.split(",") if s]
    models = [m for m in a.models.split(",") if m]
    batches = [int(v) for v in a.batches.split(",")]
    threads = [int(v) for v in a.threads.split(",")]
    impls = [i for i in a.impls.split(",") if i]
    for i in impls:
        if i not in IMPLS:
            ap.error(f"unknown implementation {i!r}")
    for m in models:
        if m not in MODELS:
            ap.error(f"unknown model {m!r}")
    builds = a.build or [str(ROOT / "build"), str(ROOT / "build-bench")]
    a.galley_bin = find_binary(builds, "bench_train_step")
    a.tta_bin = find_binary(builds, "bench_time_to_accuracy")
    a.libtorch_bin = find_binary(builds, "bench_train_step_libtorch")
    a.kernels_bin = find_binary(builds, "bench_kernels")
    m = re.search(r"project\(galley VERSION ([0-9.]+)", (ROOT / "CMakeLists.txt").read_text())
    a.galley_version = m.group(1) if m else ""
    if "conv" in suites and not a.kernels_bin:
        sys.exit(f"bench_kernels not found in {builds}; build it (it needs Google Benchmark)")
    a.pythons = {"pytorch": a.python, "pytorch_alt": a.torch_python}
    if "galley" in impls and not (a.galley_bin and a.tta_bin):
        sys.exit(f"bench_train_step / bench_time_to_accuracy not found in {builds}; build them")
    available = {"galley": True, "libtorch": a.libtorch_bin is not None,
                 "pytorch": python_has(a.python, "torch"),
                 "pytorch_alt": bool(a.torch_python) and python_has(a.torch_python, "torch"),
                 "paddle": bool(a.paddle_python) and python_has(a.paddle_python, "paddle")}
    for i in list(impls):
        if not available[i]:
            asked = {"pytorch_alt": a.torch_python, "paddle": a.paddle_python}.get(i, True)
            if asked:
                print(f"note: {i} is not available (not built, or no such Python module), skipping it",
                      file=sys.stderr)
            impls.remove(i)

    # Uncommitted changes to tracked files, other than the figures this script writes.
    exclude = []
    try:
        exclude = [f":(exclude){a.out.resolve().relative_to(ROOT)}"]
    except ValueError:
        pass
    if a.git_commit:
        commit, dirty = a.git_commit, False
    else:
        commit = git("rev-parse", "HEAD")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no", "--", ".", *exclude))
    runner = Runner(a)

    if "throughput" in suites:
        t_start = time.monotonic()
        runs = []
        cells = [(m, b, t) for m in models for b in batches for t in threads]
        paddle_batches = {int(v) for v in a.paddle_batches.split(",") if v}

        def active(rnd, m, b):
            return [i for i in impls if (i != "paddle" or (rnd < a.paddle_rounds and b in paddle_batches))
                    and i in MODEL_IMPLS.get(m, IMPLS)]

        n_total = sum(len(active(rnd, m, b)) for rnd in range(a.rounds) for m, b, _ in cells)
        k = 0
        for rnd in range(a.rounds):
            for m, b, t in cells:
                act = active(rnd, m, b)
                if not act:
                    continue
                order = act[rnd % len(act):] + act[:rnd % len(act)]
                for impl in order:
                    k += 1
                    res = runner(step_command(a, impl, m, b, t), t)
                    res.update(impl=impl, model=m, round=rnd)
                    runs.append(res)
                    flag = "  (shared CPU)" if res["background_cores"] >= a.idle_threshold else ""
                    print(f"[{k:3d}/{n_total}] round {rnd} {m:7s} batch {b:4d} threads {t} {impl:11s}"
                          f"{res['samples_per_s']:10.1f} samples/s{flag}", flush=True)
        meta = metadata(a, "cpu-train-step", impls, runs, commit, dirty, t_start)
        meta.update(rounds=a.rounds, paddle_rounds=min(a.paddle_rounds, a.rounds),
                    paddle_batches=sorted(paddle_batches), repeats_per_run=a.repeats)
        report_train(a, meta, runs, impls, models, batches, threads)

    if "conv" in suites:
        run_conv(a, impls, threads, commit, dirty)

    if "amp" in suites:
        run_amp(a, runner, impls, threads, commit, dirty)

    if "tta" in suites:
        t_start = time.monotonic()
        tta_impls = [i for i in impls if i in ("galley", "pytorch", "pytorch_alt")]
        runs = []
        seeds = [int(x) for x in a.tta_seeds.split(",") if x.strip()]
        for seed in seeds:
            for impl in tta_impls:
                res = runner(tta_command(a, impl, a.tta_threads, seed), a.tta_threads,
                             timeout=1800, retries=1)
                res["impl"] = impl
                res["seed"] = seed
                runs.append(res)
                flag = "  (shared CPU)" if res["background_cores"] >= a.idle_threshold else ""
                t = f"{res['time_s']:.1f} s" if res["reached"] else "not reached"
                print(f"time to {100 * a.target:.0f}%, seed {seed}: {impl:11s} {t} after "
                      f"{res['steps']} steps ({res['train_s']:.1f} s training){flag}", flush=True)
        meta = metadata(a, "cpu-time-to-accuracy", tta_impls, runs, commit, dirty, t_start)
        meta.update(target=a.target, epochs=a.tta_epochs, eval_every=a.eval_every,
                    threads=a.tta_threads, batch=64, seeds=seeds)
        report_tta(a, meta, runs, tta_impls)
    return 0


if __name__ == "__main__":
    sys.exit(main())
