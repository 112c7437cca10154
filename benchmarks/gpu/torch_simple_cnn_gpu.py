#!/usr/bin/env python3
"""SimpleCNN train-step throughput on a GPU in PyTorch, eager and torch.compile: the reference
galley's CUDA backend is measured against.

Usage: torch_simple_cnn_gpu.py --out FILE.json [--batches 64 256] [--steps 50]
"""
import argparse
import json
import time

import torch


class SimpleCNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 64, 3)
        self.pool = torch.nn.MaxPool2d(2)
        self.fc = torch.nn.Linear(64 * 15 * 15, 10)

    def forward(self, x):
        return self.fc(torch.flatten(self.pool(torch.relu(self.conv(x))), 1))


def measure(batch, compiled, steps):
    torch.manual_seed(0)
    model = SimpleCNN().cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = torch.nn.CrossEntropyLoss()
    x = torch.randn(batch, 3, 32, 32, device="cuda")
    y = torch.randint(0, 10, (batch,), device="cuda")

    def step():
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    if compiled:
        step = torch.compile(step)
    for _ in range(10):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) / steps)
    times.sort()
    return batch / times[len(times) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--batches", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--steps", type=int, default=50)
    args = ap.parse_args()
    results = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(0), "runs": []}
    for batch in args.batches:
        for compiled in (False, True):
            try:
                sps = measure(batch, compiled, args.steps)
                results["runs"].append({"batch": batch, "mode": "compile" if compiled else "eager",
                                        "samples_per_s": sps})
                print(f"torch {'compile' if compiled else 'eager'} batch {batch}: {sps:.0f} samples/s")
            except Exception as e:  # torch.compile may be unavailable; record why
                results["runs"].append({"batch": batch, "mode": "compile" if compiled else "eager",
                                        "error": str(e)[:300]})
    with open(args.out, "w") as f:
        json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
