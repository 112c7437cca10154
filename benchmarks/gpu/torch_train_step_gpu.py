#!/usr/bin/env python3
"""Train-step throughput of the benchmark models (models_torch.py, the same as models.h) in
PyTorch on a GPU, eager and torch.compile: the reference galley's CUDA backend is measured
against. One step: forward, cross-entropy, backward, Adam (lr 1e-3), zero grad.

Usage: torch_train_step_gpu.py --out FILE.json [--models simple fashion] [--batches 64 256]
                               [--steps 50] [--device cuda]
"""
import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import models_torch  # noqa: E402


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(name, batch, compiled, steps, device):
    torch.manual_seed(0)
    model, shape = models_torch.build(name)
    model = model.to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = torch.nn.CrossEntropyLoss()
    x = torch.randn(batch, *shape, device=device)
    y = torch.randint(0, 10, (batch,), device=device)

    def step():
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    if compiled:
        step = torch.compile(step)
    for _ in range(10):
        step()
    synchronize(device)
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        synchronize(device)
        times.append((time.perf_counter() - t0) / steps)
    times.sort()
    return batch / times[len(times) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--models", nargs="+", default=["simple", "fashion"], choices=models_torch.MODELS)
    ap.add_argument("--batches", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    device = torch.device(args.device)
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else str(device)
    results = {"torch": torch.__version__, "gpu": gpu, "runs": []}
    for name in args.models:
        for batch in args.batches:
            for compiled in (False, True):
                mode = "compile" if compiled else "eager"
                run = {"model": name, "batch": batch, "mode": mode}
                try:
                    run["samples_per_s"] = measure(name, batch, compiled, args.steps, device)
                    print(f"torch {mode} {name} batch {batch}: {run['samples_per_s']:.0f} samples/s")
                except Exception as e:  # torch.compile may be unavailable; record why
                    run["error"] = str(e)[:300]
                    print(f"torch {mode} {name} batch {batch}: failed: {run['error']}")
                results["runs"].append(run)
                with open(args.out, "w") as f:  # after every run: a timeout keeps what was done
                    json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
