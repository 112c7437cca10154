#!/usr/bin/env python3
"""Side-by-side CPU benchmark of the SimpleCNN train step: galley vs PyTorch vs libtorch.

For each batch size and thread count, runs the three implementations one after the other
(the order rotates every round), for several rounds. Each run reports the median samples/s of
its timed blocks; the table shows the median over rounds, each framework's best thread count,
and galley's throughput divided by the best peer's.

  python3 benchmarks/run_cpu.py --build build            # writes docs/benchmarks/cpu-simple-cnn.{json,md}
  python3 benchmarks/run_cpu.py --rounds 1 --batches 64  # a quick look

Other processes competing for the CPU spoil the figures, so before each run the driver waits
(up to --max-wait seconds) for the machine to be idle, measures how many cores other processes
used during the run, and repeats a run that shared the machine (up to --retries times). The
JSON records that background load for every run.
"""
import argparse
import datetime
import json
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
IMPLS = ("galley", "pytorch", "libtorch")
LABELS = {"galley": "galley", "pytorch": "PyTorch", "libtorch": "libtorch"}
README_START = "<!-- cpu-simple-cnn:start -->"
README_END = "<!-- cpu-simple-cnn:end -->"


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
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
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


def commands(a, impl, batch, threads):
    warmup, iters = (3, 10) if batch <= 64 else (2, 4)
    iters = max(1, int(round(iters * a.scale)))
    common = ["--batch", str(batch), "--threads", str(threads), "--warmup", str(warmup),
              "--iters", str(iters), "--repeats", str(a.repeats), "--json"]
    if impl == "galley":
        return [str(a.galley_bin)] + common
    if impl == "libtorch":
        return [str(a.libtorch_bin)] + common
    return [a.python, str(ROOT / "benchmarks" / "simple_cnn_torch.py")] + common


def find_binary(build_dirs, name):
    for d in build_dirs:
        for p in (Path(d) / "benchmarks" / name, Path(d) / name):
            if p.is_file() and os.access(p, os.X_OK):
                return p
    return None


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


# ----------------------------------------------------------------------------- report
def fmt(v):
    return f"{v:,.0f}" if v is not None else "n/a"


def summarise(runs, impls, batches, threads, idle_threshold):
    """median over rounds per (impl, batch, threads), then each impl's best thread count.

    Runs that shared the CPU with other processes count only when a cell has no other run."""
    med, shared = {}, set()
    for impl in impls:
        for b in batches:
            for t in threads:
                cell = [r for r in runs if r["impl"] == impl and r["batch"] == b and r["threads"] == t]
                clean = [r for r in cell if r["background_cores"] < idle_threshold]
                if cell and not clean:
                    shared.add((impl, b, t))
                vals = [r["samples_per_s"] for r in (clean or cell)]
                if vals:
                    med[(impl, b, t)] = statistics.median(vals)
    best = {}
    for impl in impls:
        for b in batches:
            cands = [(med[(impl, b, t)], t) for t in threads if (impl, b, t) in med]
            if cands:
                v, t = max(cands)
                best[(impl, b)] = {"samples_per_s": v, "threads": t,
                                   "shared_cpu": (impl, b, t) in shared}
    return med, best, shared


def markdown(meta, med, best, impls, batches, threads, shared=frozenset()):
    peers = [i for i in impls if i != "galley"]
    lines = [
        f"SimpleCNN train step (Conv2d(3,64,3) - ReLU - MaxPool2d(2) - Linear(14400,10), "
        f"cross-entropy, Adam), float32, CPU: {meta['machine']['cpu_model']}, "
        f"{meta['machine']['logical_cpus']} logical CPUs. {meta['date']}, galley "
        f"{meta['versions'].get('galley', '?')} at {meta['git_commit'][:12] or 'unknown commit'}"
        f"{' (modified)' if meta.get('git_dirty') else ''}, PyTorch "
        f"{meta['versions'].get('pytorch', 'n/a')}, libtorch {meta['versions'].get('libtorch', 'n/a')}.",
        "",
        "Samples per second, higher is better; each framework at its best thread count "
        "(in brackets); median of " + f"{meta['rounds']} rounds."
        + (f" {meta['shared_cpu_runs']} of {meta['n_runs']} runs shared the CPU with other "
           "processes (`background_cores` in the JSON); medians leave them out where a "
           "clean run exists, and cells marked * have none." if meta.get("shared_cpu_runs") else ""),
        "",
        "| batch | " + " | ".join(LABELS[i] for i in impls) +
        (" | galley / best peer |" if peers and "galley" in impls else " |"),
        "|---:|" + "---:|" * len(impls) + ("---:|" if peers and "galley" in impls else ""),
    ]
    for b in batches:
        cells = []
        for i in impls:
            e = best.get((i, b))
            cells.append(f"{fmt(e['samples_per_s'])} ({e['threads']}T){'*' if e['shared_cpu'] else ''}"
                         if e else "n/a")
        row = f"| {b} | " + " | ".join(cells) + " |"
        if peers and "galley" in impls:
            pv = [best[(p, b)]["samples_per_s"] for p in peers if (p, b) in best]
            g = best.get(("galley", b))
            row += f" {g['samples_per_s'] / max(pv):.2f}x |" if g and pv else " n/a |"
        lines.append(row)
    lines += ["", "All thread counts (samples/s, median over rounds):", "",
              "| batch | threads | " + " | ".join(LABELS[i] for i in impls) + " |",
              "|---:|---:|" + "---:|" * len(impls)]
    for b in batches:
        for t in threads:
            lines.append(f"| {b} | {t} | " + " | ".join(
                fmt(med.get((i, b, t))) + ("*" if (i, b, t) in shared else "") for i in impls) + " |")
    return "\n".join(lines) + "\n"


def update_readme(path, table):
    if not path.is_file():
        return False
    text = path.read_text()
    pat = re.compile(re.escape(README_START) + r".*?" + re.escape(README_END), re.S)
    if not pat.search(text):
        return False
    path.write_text(pat.sub(lambda _: f"{README_START}\n{table}{README_END}", text))
    return True


# ----------------------------------------------------------------------------- main
def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", action="append", default=None,
                    help="build folder(s) holding benchmarks/bench_simple_cnn[_libtorch] "
                         "(default: build, build-bench)")
    ap.add_argument("--galley-bin", type=Path, help="bench_simple_cnn executable")
    ap.add_argument("--libtorch-bin", type=Path, help="bench_simple_cnn_libtorch executable")
    ap.add_argument("--python", default="/usr/bin/python3" if Path("/usr/bin/python3").exists()
                    else sys.executable, help="Python with torch for simple_cnn_torch.py")
    ap.add_argument("--batches", default="64,256")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--impls", default=",".join(IMPLS))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3, help="timed blocks inside each run")
    ap.add_argument("--scale", type=float, default=1.0, help="multiplies the steps per timed block")
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
    ap.add_argument("--no-readme", action="store_true",
                    help="do not refresh the table in <out>/README.md")
    ap.add_argument("--from-json", type=Path,
                    help="rebuild the tables from a JSON written earlier instead of running")
    a = ap.parse_args()

    if a.from_json:
        d = json.loads(a.from_json.read_text())
        runs = d["runs"]
        meta = {k: v for k, v in d.items() if k not in ("summary", "runs")}
        a.idle_threshold = d.get("idle_threshold_cores", a.idle_threshold)
        impls = [i for i in IMPLS if any(r["impl"] == i for r in runs)]
        return report(a, meta, runs, impls, d["batches"], d["threads"])

    batches = [int(v) for v in a.batches.split(",")]
    threads = [int(v) for v in a.threads.split(",")]
    impls = [i for i in a.impls.split(",") if i]
    for i in impls:
        if i not in IMPLS:
            ap.error(f"unknown implementation {i!r}")
    builds = a.build or [str(ROOT / "build"), str(ROOT / "build-bench")]
    if "galley" in impls:
        a.galley_bin = a.galley_bin or find_binary(builds, "bench_simple_cnn")
        if not a.galley_bin:
            sys.exit(f"bench_simple_cnn not found in {builds}; build it or pass --galley-bin")
    if "libtorch" in impls:
        a.libtorch_bin = a.libtorch_bin or find_binary(builds, "bench_simple_cnn_libtorch")
        if not a.libtorch_bin:
            print("note: bench_simple_cnn_libtorch not built (no libtorch?), skipping it", file=sys.stderr)
            impls.remove("libtorch")
    if "pytorch" in impls:
        ok = subprocess.run([a.python, "-c", "import torch"], capture_output=True).returncode == 0
        if not ok:
            print(f"note: {a.python} cannot import torch, skipping PyTorch", file=sys.stderr)
            impls.remove("pytorch")

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
    runs = []
    t_start = time.monotonic()
    spent = 0.0  # seconds of waiting for idle and of reruns
    n_total = a.rounds * len(batches) * len(threads) * len(impls)
    k = 0
    for rnd in range(a.rounds):
        for b in batches:
            for t in threads:
                order = impls[rnd % len(impls):] + impls[:rnd % len(impls)]
                for impl in order:
                    k += 1
                    env = dict(os.environ, OMP_NUM_THREADS=str(t), MKL_NUM_THREADS=str(t),
                               GALLEY_NUM_THREADS=str(t))
                    cmd = commands(a, impl, b, t)
                    for attempt in range(a.retries + 1):
                        t_wait = time.monotonic()
                        idle = wait_idle(a.idle_threshold, min(a.max_wait, max(0.0, a.wait_budget - spent)))
                        waited = time.monotonic() - t_wait
                        spent += max(0.0, waited - 0.5)
                        res = run_one(cmd, env, a.timeout)
                        res.update(round=rnd, attempt=attempt, idle_before_cores=round(idle, 3),
                                   waited_s=round(waited, 1))
                        if res["background_cores"] < a.idle_threshold or spent >= a.wait_budget:
                            break
                        spent += res["wall_s"]
                    res["impl"] = impl
                    runs.append(res)
                    flag = "  (shared CPU)" if res["background_cores"] >= a.idle_threshold else ""
                    print(f"[{k:2d}/{n_total}] round {rnd} batch {b:4d} threads {t} {impl:9s}"
                          f"{res['samples_per_s']:10.1f} samples/s{flag}", flush=True)

    versions = {i: next((r["version"] for r in runs if r["impl"] == i), None) for i in impls}
    versions["python"] = platform.python_version()
    versions["compiler"] = compiler_version()
    meta = {
        "benchmark": "cpu-simple-cnn",
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "git_commit": commit,
        "git_dirty": dirty,
        "machine": {
            "cpu_model": cpu_model(),
            "logical_cpus": os.cpu_count(),
            "usable_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
            "kernel": platform.release(),
            "arch": platform.machine(),
        },
        "versions": versions,
        "rounds": a.rounds,
        "repeats_per_run": a.repeats,
        "batches": batches,
        "threads": threads,
        "runtime_s": round(time.monotonic() - t_start, 1),
    }
    return report(a, meta, runs, impls, batches, threads)


def report(a, meta, runs, impls, batches, threads):
    """Writes the JSON, the Markdown table and the README block from `runs`."""
    meta["n_runs"] = len(runs)
    meta["shared_cpu_runs"] = sum(r["background_cores"] >= a.idle_threshold for r in runs)
    meta["idle_threshold_cores"] = a.idle_threshold
    med, best, shared = summarise(runs, impls, batches, threads, a.idle_threshold)
    table = markdown(meta, med, best, impls, batches, threads, shared)
    summary = []
    for b in batches:
        row = {"batch": b}
        for i in impls:
            row[i] = best.get((i, b))
            row[i + "_by_threads"] = {str(t): med.get((i, b, t)) for t in threads}
        peers = [best[(p, b)]["samples_per_s"] for p in impls if p != "galley" and (p, b) in best]
        if ("galley", b) in best and peers:
            row["galley_over_best_peer"] = best[("galley", b)]["samples_per_s"] / max(peers)
        summary.append(row)

    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "cpu-simple-cnn.json").write_text(
        json.dumps({**meta, "summary": summary, "runs": runs}, indent=2) + "\n")
    (a.out / "cpu-simple-cnn.md").write_text(table)
    if not a.no_readme and update_readme(a.out / "README.md", table):
        print(f"updated {a.out / 'README.md'}")
    print()
    print(table)
    print(f"wrote {a.out / 'cpu-simple-cnn.json'} and {a.out / 'cpu-simple-cnn.md'} "
          f"({meta['runtime_s']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
