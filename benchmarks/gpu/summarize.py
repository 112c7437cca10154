#!/usr/bin/env python3
"""Writes the GPU train-step table: galley (eager and CUDA graph) beside PyTorch (eager and
torch.compile), from what `scripts/gpu-check.sh bench OUT` leaves; and publishes a run's table
into docs/benchmarks.

Usage:
  summarize.py OUT [--work DIR] [--meta FILE]
      reads OUT/galley-train-step-gpu.jsonl and OUT/torch-train-step-gpu.json, and from DIR
      (default OUT) fashion-gpu.log, torch-fashion-gpu.json and capped-summary.json when they
      exist; FILE (default DIR/meta.json) is a JSON object with date, commit, gpu, driver, cuda
      and cpu. Writes OUT/gpu-train-step.md and OUT/gpu-train-step.json.
  summarize.py --publish OUT [--docs docs/benchmarks]
      copies OUT/gpu-train-step.{md,json} into the docs folder and puts the table into its
      README.md between <!-- gpu-train-step:start --> and <!-- gpu-train-step:end -->.
"""
import argparse
import json
import os
import re
import shutil
import sys

START, END = "<!-- gpu-train-step:start -->", "<!-- gpu-train-step:end -->"


def load_json(path, default=None):
    if not path or not os.path.exists(path):
        return default
    try:
        with open(path) as f:
            return json.load(f)
    except ValueError:
        # A file cut short by a timeout, or a log with the JSON on its last line.
        try:
            with open(path) as f:
                return json.loads(f.read().strip().splitlines()[-1])
        except (ValueError, IndexError):
            return default


def fashion_epochs(path):
    """The epoch lines of examples/fashion_mnist.cpp (training time, evaluation excluded)."""
    epochs = []
    if not path or not os.path.exists(path):
        return epochs
    with open(path, errors="replace") as f:
        for line in f:
            last = line.replace("\r", "\n").strip().splitlines()
            m = re.search(r"epoch (\d+)/\d+ .* ([0-9.]+) samples/s\s+train ([0-9.]+) s\s+"
                          r"test accuracy ([0-9.]+)%", last[-1] if last else "")
            if m:
                epochs.append({"epoch": int(m.group(1)), "samples_per_s": float(m.group(2)),
                               "train_s": float(m.group(3)), "accuracy": float(m.group(4)) / 100})
    return epochs


def summarize(out, work, meta_path):
    galley = []
    path = os.path.join(out, "galley-train-step-gpu.jsonl")
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                try:
                    if line.strip().startswith("{"):
                        galley.append(json.loads(line))
                except ValueError:
                    pass
    torch = load_json(os.path.join(out, "torch-train-step-gpu.json"), {})
    meta = load_json(meta_path, {}) or {}
    if "commit" not in meta and os.path.exists(os.path.join(work, "commit.txt")):
        meta["commit"] = open(os.path.join(work, "commit.txt")).read().strip()
    commit = meta.get("commit") or "unknown"
    short = commit.split()[0][:12] + (" (modified)" if "modified" in commit else "")
    gpu = meta.get("gpu") or torch.get("gpu") or "the GPU"

    def galley_rate(model, b, graph, amp="off"):
        for r in galley:
            if (r.get("model") == model and r.get("batch") == b and r.get("graph") == graph
                    and r.get("amp", "off") == amp):
                return r.get("samples_per_s")
        return None

    def torch_rate(model, b, mode):
        for r in torch.get("runs", []):
            if (r.get("model", "simple") == model and r.get("batch") == b and r.get("mode") == mode
                    and "samples_per_s" in r):
                return r["samples_per_s"]
        return None

    cells = {(r["model"], r["batch"]) for r in galley if "model" in r and "batch" in r}
    cells |= {(r["model"], r["batch"]) for r in torch.get("runs", []) if "model" in r}
    order = {"simple": 0, "fashion": 1, "vgg": 2, "resnet": 3}
    rows = []
    for model, b in sorted(cells, key=lambda c: (order.get(c[0], 9), c[0], c[1])):
        rows.append({"model": model, "batch": b, "galley_eager": galley_rate(model, b, False),
                     "galley_graph": galley_rate(model, b, True),
                     "torch_eager": torch_rate(model, b, "eager"),
                     "torch_compile": torch_rate(model, b, "compile")})

    def fmt(v):
        return f"{v:,.0f}" if v else "-"

    def ratio(a, b):
        return f"{a / b:.2f}x" if a and b else "-"

    machine = ", ".join(x for x in [
        f"driver {meta['driver']}" if meta.get("driver") else "",
        f"CUDA {meta['cuda']}" if meta.get("cuda") else "",
        f"cuDNN {torch['cudnn']} in PyTorch" if torch.get("cudnn") else "",
        meta.get("cpu", "")] if x)
    autotune = "on" if torch.get("cudnn_benchmark") else "off"
    lines = [
        f"Train step (forward, cross-entropy, backward, Adam, zero grad), float32, on {gpu}"
        + (f" ({machine})" if machine else "") + ". "
        + (f"{meta['date']}, " if meta.get("date") else "")
        + f"galley at {short}; "
        + (f"PyTorch {torch['torch']} (cuDNN autotuner {autotune}). " if torch.get("runs") else
           "no PyTorch figures. ")
        + "Samples/s, median of 5 blocks of 50 steps after 10 warm-up steps; models as in "
        "benchmarks/models.h.",
        "",
        "| model | batch | galley eager | galley CUDA graph | PyTorch eager | torch.compile | "
        "graph ÷ PyTorch eager | graph ÷ torch.compile |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(f"| {r['model']} | {r['batch']} | {fmt(r['galley_eager'])} | "
                     f"{fmt(r['galley_graph'])} | {fmt(r['torch_eager'])} | "
                     f"{fmt(r['torch_compile'])} | {ratio(r['galley_graph'], r['torch_eager'])} | "
                     f"{ratio(r['galley_graph'], r['torch_compile'])} |")
    problems = [f"galley {'CUDA graph' if r.get('graph') else 'eager'} {r.get('model')} batch "
                f"{r.get('batch')}{' amp ' + r['amp'] if r.get('amp', 'off') != 'off' else ''}: "
                f"{r['error']}" for r in galley if r.get("error")]
    if torch.get("error"):
        problems.append(f"PyTorch: {torch['error']}")
    problems += [f"PyTorch {r.get('mode')} {r.get('model')} batch {r.get('batch')}: "
                 f"{r.get('error') or r.get('skipped')}" for r in torch.get("runs", [])
                 if r.get("error") or r.get("skipped")]
    if problems:
        lines += ["", "Missing cells:", ""] + [f"- {p}" for p in problems]

    # Mixed precision: galley's eager step under autocast beside its float32 eager step.
    amp_cells = {(r["model"], r["batch"]) for r in galley
                 if r.get("amp", "off") != "off" and "model" in r and "batch" in r}
    amp_cells |= {(r["model"], r["batch"]) for r in torch.get("runs", [])
                  if r.get("mode", "").startswith("eager_") and "model" in r}
    amp_cells = sorted(amp_cells, key=lambda c: (order.get(c[0], 9), c[0], c[1]))
    if amp_cells:
        lines += ["", "Mixed precision, eager: the forward and the loss under autocast (galley's "
                  "`amp::Autocast`, PyTorch's `torch.autocast`; fp16 with a GradScaler). Goal: "
                  "galley bf16 ≥ 1.8x galley float32 on resnet at batch 256.", "",
                  "| model | batch | galley float32 | galley bf16 | galley fp16 | PyTorch bf16 | "
                  "PyTorch fp16 | galley bf16 ÷ float32 | galley bf16 ÷ PyTorch bf16 |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for model, b in amp_cells:
            f32, bf, fp = (galley_rate(model, b, False, amp) for amp in ("off", "bf16", "fp16"))
            tbf, tfp = torch_rate(model, b, "eager_bf16"), torch_rate(model, b, "eager_fp16")
            lines.append(f"| {model} | {b} | {fmt(f32)} | {fmt(bf)} | {fmt(fp)} | {fmt(tbf)} | "
                         f"{fmt(tfp)} | {ratio(bf, f32)} | {ratio(bf, tbf)} |")

    # Fashion-MNIST example epochs (training time, evaluation excluded) beside PyTorch's.
    fashion = fashion_epochs(os.path.join(work, "fashion-gpu.log"))
    torch_fashion = load_json(os.path.join(work, "torch-fashion-gpu.json"))
    if fashion or torch_fashion:
        g_epoch = sum(f["train_s"] for f in fashion) / len(fashion) if fashion else None
        t_epoch = (torch_fashion["train_s"] / torch_fashion["epochs"]
                   if torch_fashion and torch_fashion.get("epochs") else None)
        g_acc = f"{100 * fashion[-1]['accuracy']:.2f}%" if fashion else "-"
        t_acc = (f"{100 * torch_fashion['best_accuracy']:.2f}%"
                 if torch_fashion and torch_fashion.get("best_accuracy") else "-")
        lines += ["", "Fashion-MNIST example on the GPU, 2 epochs (batch 64, Adam; galley from its "
                  "loader with pinned buffers, PyTorch from tensors already on the GPU; "
                  "evaluation excluded):", "",
                  "| | galley | PyTorch eager | galley ÷ PyTorch |", "|---|---:|---:|---:|",
                  f"| training seconds per epoch | {g_epoch:.2f} |" if g_epoch else
                  "| training seconds per epoch | - |"]
        lines[-1] += (f" {t_epoch:.2f} |" if t_epoch else " - |") + (
            f" {g_epoch / t_epoch:.2f}x |" if g_epoch and t_epoch else " - |")
        lines.append(f"| test accuracy after the last epoch | {g_acc} | {t_acc} | |")

    capped = load_json(os.path.join(work, "capped-summary.json"))
    if capped and capped.get("jobs"):
        jobs = capped["jobs"]
        states = ", ".join(f"{j.get('name')} {j.get('status')} in {j.get('run_s', 0):.1f} s"
                           for j in jobs)
        mem = [d.get("max_memory_used_mb") for d in capped.get("gpus", {}).get("devices", [])
               if isinstance(d, dict) and d.get("max_memory_used_mb") is not None]
        lines += ["", f"Two jobs side by side under galley-launch, each capped at "
                  f"{jobs[0].get('memory_fraction', '?')} of the GPU's memory: {states}; makespan "
                  f"{capped.get('makespan_s', 0):.1f} s against {capped.get('sum_of_job_times_s', 0):.1f} s "
                  f"of job time ({capped.get('packing_speedup', 0):.2f}x)"
                  + (f", at most {max(mem):,} MiB of GPU memory in use." if mem else ".")]
    packing = load_json(os.path.join(work, "packing-gpu.json"))
    if isinstance(packing, list) and packing:
        lines += ["", "Independent jobs on one GPU (benchmarks/run_packing.py: K copies one after "
                  "the other, then side by side pinned to a share of the cores, then side by "
                  "side with default settings; each side-by-side job capped at 0.9 / K of the "
                  "GPU's memory):", ""]
        lines += ["| model | jobs | way | makespan (s) | aggregate samples/s | throughput / "
                  "serial | GPU busy |", "|---|---:|---|---:|---:|---:|---:|"]
        for r in packing:
            for way in ("serial", "packed", "default"):
                w = r.get("ways", {}).get(way)
                if not w:
                    continue
                u = w.get("gpu_utilisation_pct")
                lines.append(f"| {r.get('model')} | {r.get('jobs')} | {way} | "
                             f"{w['makespan_s']:.1f} | {w['aggregate_samples_per_s']:,.0f} | "
                             f"{w['throughput_vs_serial']:.2f}x | "
                             + (f"{u:.0f}% |" if u is not None else "- |"))
    lines += ["", "Goals: galley ≥ 2x PyTorch eager and ≥ 1x torch.compile for SimpleCNN at "
              "batch 64 and 256; ≥ 1.5x aggregate throughput from packing small jobs on one GPU."]
    with open(os.path.join(out, "gpu-train-step.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(out, "gpu-train-step.json"), "w") as f:
        json.dump({"meta": meta, "commit": commit, "torch": torch, "galley": galley, "table": rows,
                   "fashion_galley": fashion, "fashion_torch": torch_fashion,
                   "capped_jobs": capped, "packing": packing}, f, indent=2)
    print("\n".join(lines))


def publish(out, docs):
    md = os.path.join(out, "gpu-train-step.md")
    if not os.path.exists(md):
        sys.exit(f"summarize.py: no {md} (run the bench phase first)")
    for name in ("gpu-train-step.md", "gpu-train-step.json"):
        if os.path.exists(os.path.join(out, name)):
            shutil.copyfile(os.path.join(out, name), os.path.join(docs, name))
    readme = os.path.join(docs, "README.md")
    text = open(readme).read()
    if START not in text or END not in text:
        sys.exit(f"summarize.py: {readme} has no {START} ... {END} block")
    table = open(md).read().strip()
    head, rest = text.split(START, 1)
    text = head + START + "\n" + table + "\n" + END + rest.split(END, 1)[1]
    with open(readme, "w") as f:
        f.write(text)
    print(f"published {md} into {docs}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", nargs="?")
    ap.add_argument("--work")
    ap.add_argument("--meta")
    ap.add_argument("--publish", metavar="OUT")
    ap.add_argument("--docs", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                   "..", "..", "docs", "benchmarks"))
    a = ap.parse_args()
    if a.publish:
        publish(a.publish, a.docs)
    elif a.out:
        work = a.work or a.out
        summarize(a.out, work, a.meta or os.path.join(work, "meta.json"))
    else:
        ap.error("give OUT, or --publish OUT")


if __name__ == "__main__":
    main()
