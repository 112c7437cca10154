#!/usr/bin/env python3
"""Train-step throughput in PyTorch (CPU), the reference for bench_train_step, for the models
of models_torch.py (the same as models.h).

One step: forward, CrossEntropyLoss, backward, Adam(lr=1e-3) step, zero grad.

  python3 train_step_torch.py --model vgg --batch 64 --threads 1 --warmup 5 --iters 20 --repeats 5 [--json]
  python3 train_step_torch.py --batch 64 --phases      # time forward / backward / optimizer
  python3 train_step_torch.py --batch 64 --profile     # per-op table from torch.profiler

Prints samples/s: the median over `repeats` timed blocks of `iters` steps each.
"""
import argparse
import json
import statistics
import sys
import time

import torch
import torch.nn as nn

from models_torch import MODELS, build


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=MODELS, default="simple")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    ap.add_argument("--phases", action="store_true", help="also time forward/loss/backward/optimizer")
    ap.add_argument("--profile", action="store_true", help="print torch.profiler's per-op table")
    ap.add_argument("--amp", choices=("off", "bf16"), default="off",
                    help="forward and loss under torch.autocast('cpu', dtype=torch.bfloat16)")
    a = ap.parse_args()

    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model, shape = build(a.model)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(a.batch, *shape, generator=g)
    y = torch.randint(0, 10, (a.batch,), generator=g, dtype=torch.int64)

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.amp == "bf16"):
            out = model(x)
            loss = loss_fn(out, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    for _ in range(a.warmup):
        step()

    times = []
    for _ in range(a.repeats):
        t0 = time.perf_counter()
        for _ in range(a.iters):
            loss = step()
        loss.item()
        times.append(time.perf_counter() - t0)
    rates = [a.batch * a.iters / t for t in times]
    med = statistics.median(rates)

    phases = None
    if a.phases:
        acc = {"forward": 0.0, "loss": 0.0, "backward": 0.0, "optimizer": 0.0}
        n = a.iters * a.repeats
        for _ in range(n):
            t0 = time.perf_counter()
            out = model(x)
            t1 = time.perf_counter()
            loss = loss_fn(out, y)
            t2 = time.perf_counter()
            loss.backward()
            t3 = time.perf_counter()
            opt.step()
            opt.zero_grad(set_to_none=True)
            t4 = time.perf_counter()
            acc["forward"] += t1 - t0
            acc["loss"] += t2 - t1
            acc["backward"] += t3 - t2
            acc["optimizer"] += t4 - t3
        phases = {k: 1e3 * v / n for k, v in acc.items()}

    if a.profile:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(a.iters):
                step()
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25), file=sys.stderr)

    result = {
        "impl": "pytorch",
        "version": torch.__version__,
        "model": a.model,
        "batch": a.batch,
        "threads": a.threads,
        "warmup": a.warmup,
        "iters": a.iters,
        "repeats": a.repeats,
        "samples_per_s": med,
        "samples_per_s_all": rates,
        "step_ms": 1e3 * a.batch / med,
        "final_loss": float(loss.item()),
        "amp": a.amp,
    }
    if phases:
        result["phases_ms"] = phases
    if a.json:
        print(json.dumps(result))
    else:
        print(f"pytorch {torch.__version__} {a.model} batch={a.batch} threads={a.threads}: "
              f"{med:.1f} samples/s ({result['step_ms']:.2f} ms/step, loss {result['final_loss']:.4f})")
        if phases:
            print("  " + "  ".join(f"{k} {v:.2f} ms" for k, v in phases.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
