#!/usr/bin/env python3
"""Time to a Fashion-MNIST test accuracy in PyTorch (CPU, or a GPU with --device cuda), the reference for
bench_time_to_accuracy: the "fashion" model of models_torch.py, Adam(lr=1e-3), batch 64, images
scaled to [0, 1] and normalised with mean 0.2860 and std 0.3530, a fresh shuffle each epoch.
Every --eval-every steps of an epoch and at its end it measures the accuracy on the 10,000
test images; the run stops at the first evaluation at or above --target, or after --epochs
epochs ("not reached"). The reported time is training only (batches are sliced from tensors in
memory, as galley's loader does without workers); evaluation time is reported separately.

  python3 time_to_accuracy_torch.py [--data DIR] [--threads T] [--target 0.9] [--epochs 3]
                                    [--eval-every 235] [--seed 0] [--device cpu|cuda] [--json]

On a GPU the data sits on the device and the clock is read after torch.cuda.synchronize().
"""
import argparse
import gzip
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn

from models_torch import build

MEAN, STD = 0.2860, 0.3530


def read_idx(root, stem):
    for name in (stem, stem + ".gz"):
        p = Path(root) / name
        if p.is_file():
            raw = gzip.decompress(p.read_bytes()) if name.endswith(".gz") else p.read_bytes()
            ndim = raw[3]
            dims = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
            return torch.frombuffer(bytearray(raw[4 + 4 * ndim:]), dtype=torch.uint8).reshape(dims)
    raise FileNotFoundError(f"{stem}[.gz] not found in {root}")


def load(root, split):
    x = read_idx(root, f"{split}-images-idx3-ubyte").float().div_(255).sub_(MEAN).div_(STD)
    y = read_idx(root, f"{split}-labels-idx1-ubyte").long()
    return x.unsqueeze(1).contiguous(), y


def evaluate(model, x, y):
    model.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, len(y), 1000):
            correct += (model(x[i:i + 1000]).argmax(1) == y[i:i + 1000]).sum().item()
    model.train()
    return correct / len(y)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=os.environ.get("GALLEY_FASHION_MNIST_DIR",
                                                     "/usr/share/datasets/fashion-mnist"))
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--target", type=float, default=0.9)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--eval-every", type=int, default=235)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    dev = torch.device(a.device)

    def now():
        if dev.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter()

    if a.threads > 0:
        torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    xtr, ytr = (t.to(dev) for t in load(a.data, "train"))
    xte, yte = (t.to(dev) for t in load(a.data, "t10k"))
    model, _ = build("fashion")
    model.to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    g = torch.Generator().manual_seed(a.seed)
    n, bs = len(ytr), 64
    steps_per_epoch = (n + bs - 1) // bs

    evals, train_s, eval_s, step, reached = [], 0.0, 0.0, 0, False

    def check():
        nonlocal eval_s, reached
        t0 = now()
        acc = evaluate(model, xte, yte)
        eval_s += now() - t0
        evals.append({"step": step, "epoch": round(step / steps_per_epoch, 3),
                      "train_s": round(train_s, 3), "accuracy": acc})
        if not a.json:
            print(f"step {step:6d}  epoch {step / steps_per_epoch:.2f}  train {train_s:.1f} s  "
                  f"test accuracy {100 * acc:.2f}%", flush=True)
        reached = acc >= a.target

    for _ in range(a.epochs):
        if reached:
            break
        t0 = now()
        perm = torch.randperm(n, generator=g).to(dev)
        for k, i in enumerate(range(0, n, bs), 1):
            idx = perm[i:i + bs]
            loss = loss_fn(model(xtr[idx]), ytr[idx])
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            step += 1
            if k % a.eval_every == 0 or k == steps_per_epoch:
                train_s += now() - t0
                check()
                if reached:
                    break
                t0 = now()

    last = evals[-1]
    res = {"impl": "pytorch", "version": torch.__version__, "device": a.device,
           "threads": torch.get_num_threads(),
           "target": a.target, "reached": reached, "time_s": last["train_s"] if reached else None,
           "steps": last["step"], "epochs": last["epoch"], "train_s": round(train_s, 3),
           "eval_s": round(eval_s, 3), "best_accuracy": max(e["accuracy"] for e in evals),
           "evals": evals}
    if a.json:
        print(json.dumps(res))
    elif reached:
        print(f"reached {100 * last['accuracy']:.2f}% after {step} steps ({last['epoch']:.2f} epochs) "
              f"in {last['train_s']:.1f} s of training")
    else:
        print(f"not reached: {100 * last['accuracy']:.2f}% after {a.epochs} epochs ({train_s:.1f} s of training)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
