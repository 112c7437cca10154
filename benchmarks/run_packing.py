#!/usr/bin/env python3
"""Packing K independent training jobs onto one machine: serial, packed, and side by side.

For each model it runs K copies of a real galley training job three ways and times each:

  serial   one after the other, each with every core of the machine (what a user does today
           when jobs must not fight);
  packed   all at once, each pinned to its own share of the cores (cores / K) with that many
           threads, as galley-launch's `cpus` does;
  default  all at once as users start them by default: no pinning, no thread setting (each
           job sees every core).

It reports each job's wall time, the makespan of each way, the aggregate throughput (samples
of all K jobs over the makespan) and the ratios to serial. The serial time is measured, never
inferred from the packed jobs' own times.

  benchmarks/run_packing.py --build build --jobs 2 --out docs/launch-packing.json \\
      --plot docs/launch-packing.png

The jobs: `fashion` is examples/fashion_mnist (1 epoch over --limit images, evaluation
included), `simple` is examples/simple_cnn (the design's SimpleCNN on synthetic 3x32x32 data).

With --device cuda:0 the jobs train on that GPU: the jobs run side by side share it, each capped
at 0.9 / K of its memory (GALLEY_GPU_MEMORY_FRACTION), and the GPU's utilisation is sampled
(nvidia-smi) during each way.
"""
import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import threading
import time

from run_cpu import cpu_model


def commit():
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, cwd=os.path.dirname(os.path.abspath(__file__)))
        return out.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def job_command(build, model, args):
    if model == "fashion":
        cmd = [os.path.join(build, "examples", "fashion_mnist"), "--epochs", "1", "--limit",
               str(args.limit), "--data", args.data]
        if args.device:
            cmd += ["--device", args.device]
        return cmd, args.limit
    if model == "simple":
        # DataParallel over every device: the GPU where there is one (CUDA_VISIBLE_DEVICES picks).
        return ([os.path.join(build, "examples", "simple_cnn"), "1", str(args.simple_samples)],
                args.simple_samples)
    raise ValueError(model)


def clean_env(args, jobs_at_once=1):
    env = dict(os.environ)
    for k in ("GALLEY_NUM_THREADS", "OMP_NUM_THREADS", "GALLEY_GPU_MEMORY_FRACTION",
              "GALLEY_GPU_MEMORY_LIMIT_MB"):
        env.pop(k, None)
    if args.device and args.device.startswith("cuda"):
        env["CUDA_VISIBLE_DEVICES"] = args.device.split(":")[1] if ":" in args.device else "0"
        if jobs_at_once > 1:
            env["GALLEY_GPU_MEMORY_FRACTION"] = f"{0.9 / jobs_at_once:.3f}"
        if args.device != "cuda:0":
            sys.exit("--device: give cuda:0 (the jobs see only the chosen GPU, as cuda:0)")
    return env


class GpuSampler:
    """Mean utilisation of the GPUs while alive, sampled by nvidia-smi (None without it)."""

    def __init__(self, enabled):
        self.samples, self.proc, self.thread = [], None, None
        if not enabled or not shutil.which("nvidia-smi"):
            return
        self.proc = subprocess.Popen(["nvidia-smi", "--query-gpu=utilization.gpu",
                                      "--format=csv,noheader,nounits", "-lms", "200"],
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        for line in self.proc.stdout:
            try:
                self.samples.append(float(line.strip().split(",")[0]))
            except ValueError:
                pass

    def stop(self):
        if not self.proc:
            return None
        self.proc.terminate()
        self.proc.wait()
        self.thread.join(timeout=2)
        return sum(self.samples) / len(self.samples) if self.samples else None


def run_all(commands, envs, cpus):
    """Starts every command at once (each pinned to cpus[i] when given); returns wall times."""
    start = time.monotonic()
    procs = []
    for cmd, env, cpu in zip(commands, envs, cpus):
        pre = (lambda c=cpu: os.sched_setaffinity(0, c)) if cpu else None
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.PIPE, preexec_fn=pre))
    walls = [None] * len(procs)
    pending = set(range(len(procs)))
    while pending:
        for i in list(pending):
            if procs[i].poll() is not None:
                walls[i] = time.monotonic() - start
                pending.discard(i)
        time.sleep(0.01)
    for i, p in enumerate(procs):
        if p.returncode != 0:
            err = p.stderr.read().decode(errors="replace")[-2000:]
            sys.exit(f"job {i} ({' '.join(commands[i])}) failed with {p.returncode}:\n{err}")
    return walls


def measure(model, args, cores, k):
    cmd, samples = job_command(args.build, model, args)
    share = max(1, len(cores) // k)
    gpu = bool(args.device and args.device.startswith("cuda"))
    result = {"model": model, "jobs": k, "samples_per_job": samples, "command": cmd,
              "device": args.device or "cpu"}
    ways = {}
    # serial: one job at a time with every core.
    sampler = GpuSampler(gpu)
    walls = []
    for _ in range(k):
        walls += run_all([cmd], [clean_env(args)], [None])
    ways["serial"] = {"job_wall_s": walls, "makespan_s": sum(walls),
                      "gpu_utilisation_pct": sampler.stop()}
    # packed: each job pinned to its own cores, as many threads as cores.
    envs, cpus = [], []
    for i in range(k):
        start = (i * share) % len(cores)
        mine = cores[start:start + share]
        env = clean_env(args, k)
        env["GALLEY_NUM_THREADS"] = env["OMP_NUM_THREADS"] = str(len(mine))
        envs.append(env)
        cpus.append(set(mine))
    sampler = GpuSampler(gpu)
    walls = run_all([cmd] * k, envs, cpus)
    ways["packed"] = {"job_wall_s": walls, "makespan_s": max(walls),
                      "cores": [sorted(c) for c in cpus], "gpu_utilisation_pct": sampler.stop()}
    # default: all at once, no settings (but the memory cap, without which GPU jobs cannot share).
    sampler = GpuSampler(gpu)
    walls = run_all([cmd] * k, [clean_env(args, k)] * k, [None] * k)
    ways["default"] = {"job_wall_s": walls, "makespan_s": max(walls),
                       "gpu_utilisation_pct": sampler.stop()}
    serial = ways["serial"]["makespan_s"]
    for name, w in ways.items():
        w["aggregate_samples_per_s"] = k * samples / w["makespan_s"]
        w["time_vs_serial"] = w["makespan_s"] / serial
        w["throughput_vs_serial"] = serial / w["makespan_s"]
    result["ways"] = ways
    return result


def table(results):
    gpu = any(w.get("gpu_utilisation_pct") is not None for r in results
              for w in r["ways"].values())
    lines = ["| model | way | jobs | makespan (s) | each job (s) | aggregate samples/s | "
             "time / serial | throughput / serial |" + (" GPU busy |" if gpu else ""),
             "|---|---|---|---|---|---|---|---|" + ("---|" if gpu else "")]
    for r in results:
        for name in ("serial", "packed", "default"):
            w = r["ways"][name]
            each = ", ".join(f"{t:.1f}" for t in w["job_wall_s"])
            line = (f"| {r['model']} | {name} | {r['jobs']} | {w['makespan_s']:.1f} | {each} "
                    f"| {w['aggregate_samples_per_s']:.0f} | {w['time_vs_serial']:.2f} "
                    f"| {w['throughput_vs_serial']:.2f}x |")
            if gpu:
                u = w.get("gpu_utilisation_pct")
                line += f" {u:.0f}% |" if u is not None else " - |"
            lines.append(line)
    return "\n".join(lines)


def plot(results, path, baseline=None):
    """Throughput of the side-by-side ways over the serial way of the same run (the machine's
    speed drifts between runs; a ratio within one run does not); with `baseline` (an earlier
    run's results) its ratios beside them."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    before = {(r["model"], r["jobs"]): r for r in (baseline or [])}
    fig, axes = plt.subplots(1, len(results), figsize=(4.6 * len(results), 3.6), squeeze=False)
    for ax, r in zip(axes[0], results):
        b = before.get((r["model"], r["jobs"]))
        runs = ([("before", b, "#bbbbbb")] if b else []) + [("now" if b else "", r, None)]
        width = 0.8 / len(runs)
        for i, (label, run, color) in enumerate(runs):
            for j, way in enumerate(("packed", "default")):
                v = run["ways"][way]["throughput_vs_serial"]
                c = color or {"packed": "#2a7ab9", "default": "#d9822b"}[way]
                bar = ax.bar(j + (i - (len(runs) - 1) / 2) * width, v, width * 0.95, color=c)[0]
                ax.text(bar.get_x() + bar.get_width() / 2, v, f"{label}\n{v:.2f}x", ha="center",
                        va="bottom", fontsize=8)
        ax.axhline(1.0, color="#444444", linewidth=0.8, linestyle="--")
        ax.set_xticks([0, 1], ["packed (pinned share)", "default (as started)"])
        ax.set_ylim(0, max(1.6, ax.get_ylim()[1] * 1.15))
        ax.set_title(f"{r['model']}: {r['jobs']} jobs on {r.get('device', 'cpu')}")
        ax.set_ylabel("throughput / serial (same run)")
    m = results[0]["machine"]
    fig.suptitle(f"{m['cpu']}, {m['cores']} cores, {m['date']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build", help="galley build directory (examples built)")
    ap.add_argument("--jobs", default="2", help="K copies of each job; a list (2,4) runs each K")
    ap.add_argument("--device", help="train on this GPU (cuda:0) instead of the CPU")
    ap.add_argument("--models", default="simple,fashion")
    ap.add_argument("--limit", type=int, default=20000, help="Fashion-MNIST training images")
    ap.add_argument("--simple-samples", type=int, default=16384,
                    help="synthetic samples of the SimpleCNN job's one epoch")
    ap.add_argument("--data", default=os.environ.get("GALLEY_FASHION_MNIST_DIR",
                                                     "/usr/share/datasets/fashion-mnist"))
    ap.add_argument("--out", help="JSON file for the figures")
    ap.add_argument("--plot", help="PNG file for the plot (matplotlib)")
    ap.add_argument("--from-json", help="plot (and print) an earlier run's --out instead of running")
    ap.add_argument("--baseline", help="an earlier run's --out, drawn beside this one ('before')")
    args = ap.parse_args()
    try:
        job_counts = [int(k) for k in str(args.jobs).split(",")]
    except ValueError:
        sys.exit(f"--jobs {args.jobs}: expected a number or a list such as 2,4")
    if not job_counts or min(job_counts) < 1:
        sys.exit("--jobs must be at least 1")
    baseline = None
    if args.baseline:
        with open(args.baseline) as f:
            baseline = json.load(f)
    if args.from_json:
        with open(args.from_json) as f:
            results = json.load(f)
        print(table(results))
        if args.plot:
            plot(results, args.plot, baseline)
        return
    cores = sorted(os.sched_getaffinity(0))
    machine = {"cpu": cpu_model(), "cores": len(cores), "date": datetime.date.today().isoformat(),
               "commit": commit()}
    results = []
    for k in job_counts:
        for model in args.models.split(","):
            r = measure(model, args, cores, k)
            r["machine"] = machine
            results.append(r)
            print(table([r]), flush=True)
            if args.out:  # after each, so that a run cut short keeps what it measured
                with open(args.out, "w") as f:
                    json.dump(results, f, indent=1)
    print(f"\n{machine['cpu']}, {machine['cores']} cores, {machine['date']}, commit "
          f"{machine['commit']}\n")
    print(table(results))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    if args.plot:
        plot(results, args.plot, baseline)


if __name__ == "__main__":
    main()
