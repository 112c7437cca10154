#!/usr/bin/env python3
"""Writes the GPU train-step table: galley (eager and CUDA graph) beside PyTorch (eager and
torch.compile), from the files scripts/gpu-check.sh leaves in its output folder.

Usage: summarize.py OUT_DIR   (reads galley-train-step-gpu.jsonl and torch-train-step-gpu.json,
                               writes gpu-train-step.md and gpu-train-step.json)
"""
import json
import os
import re
import sys


def main():
    out = sys.argv[1]
    galley = []
    path = os.path.join(out, "galley-train-step-gpu.jsonl")
    if os.path.exists(path):
        with open(path) as f:
            galley = [json.loads(line) for line in f if line.strip().startswith("{")]
    torch = {}
    path = os.path.join(out, "torch-train-step-gpu.json")
    if os.path.exists(path):
        with open(path) as f:
            torch = json.load(f)
    commit = open(os.path.join(out, "commit.txt")).read().strip() if os.path.exists(
        os.path.join(out, "commit.txt")) else "unknown"
    rows = []
    for model, b in sorted({(r["model"], r["batch"]) for r in galley}):
        def galley_rate(graph):
            for r in galley:
                if r["model"] == model and r["batch"] == b and r["graph"] == graph:
                    return r["samples_per_s"]
            return None

        def torch_rate(mode):
            for r in torch.get("runs", []):
                if (r.get("model", "simple") == model and r["batch"] == b and r["mode"] == mode
                        and "samples_per_s" in r):
                    return r["samples_per_s"]
            return None

        rows.append({"model": model, "batch": b, "galley_eager": galley_rate(False),
                     "galley_graph": galley_rate(True), "torch_eager": torch_rate("eager"),
                     "torch_compile": torch_rate("compile")})

    def fmt(v):
        return f"{v:,.0f}" if v else "-"

    def ratio(a, b):
        return f"{a / b:.2f}x" if a and b else "-"

    lines = [
        f"Train step (forward, cross-entropy, backward, Adam) on {torch.get('gpu', 'the GPU')}, "
        f"samples/s, median of 5 blocks. galley at {commit[:12]}; PyTorch {torch.get('torch', '?')}. "
        "Models as in benchmarks/models.h.",
        "",
        "| model | batch | galley eager | galley CUDA graph | PyTorch eager | torch.compile | graph ÷ eager PyTorch | graph ÷ torch.compile |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(f"| {r['model']} | {r['batch']} | {fmt(r['galley_eager'])} | {fmt(r['galley_graph'])} | "
                     f"{fmt(r['torch_eager'])} | {fmt(r['torch_compile'])} | "
                     f"{ratio(r['galley_graph'], r['torch_eager'])} | "
                     f"{ratio(r['galley_graph'], r['torch_compile'])} |")
    # Fashion-MNIST example epochs (training time, evaluation excluded) beside PyTorch's.
    fashion = []
    path = os.path.join(out, "fashion-gpu.log")
    if os.path.exists(path):
        for line in open(path):
            m = re.search(r"epoch (\d+)/\d+ .* ([0-9.]+) samples/s\s+train ([0-9.]+) s\s+test accuracy ([0-9.]+)%",
                          line.replace("\r", "\n").splitlines()[-1] if line.strip() else "")
            if m:
                fashion.append({"epoch": int(m.group(1)), "samples_per_s": float(m.group(2)),
                                "train_s": float(m.group(3)), "accuracy": float(m.group(4)) / 100})
    torch_fashion = None
    path = os.path.join(out, "torch-fashion-gpu.json")
    if os.path.exists(path):
        try:
            torch_fashion = json.loads(open(path).read().strip().splitlines()[-1])
        except (ValueError, IndexError):
            torch_fashion = None
    if fashion or torch_fashion:
        g_epoch = sum(f["train_s"] for f in fashion) / len(fashion) if fashion else None
        t_epoch = torch_fashion["train_s"] / torch_fashion["epochs"] if torch_fashion and torch_fashion.get("epochs") else None
        lines += ["", "Fashion-MNIST example, training time per epoch on the GPU (batch 64, Adam, "
                  "evaluation excluded; galley from its loader with pinned buffers, PyTorch from tensors "
                  "already on the GPU):", "",
                  "| | galley | PyTorch eager | galley ÷ PyTorch time |", "|---|---:|---:|---:|",
                  f"| seconds per epoch | {g_epoch:.2f} |" if g_epoch else "| seconds per epoch | - |"]
        lines[-1] += (f" {t_epoch:.2f} |" if t_epoch else " - |") + (
            f" {g_epoch / t_epoch:.2f}x |" if g_epoch and t_epoch else " - |")
    lines += ["", "Goals: galley ≥ 2x PyTorch eager and ≥ 1x torch.compile for SimpleCNN at batch 64 and 256."]
    with open(os.path.join(out, "gpu-train-step.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(out, "gpu-train-step.json"), "w") as f:
        json.dump({"commit": commit, "torch": torch, "galley": galley, "table": rows,
                   "fashion_galley": fashion, "fashion_torch": torch_fashion}, f, indent=2)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
