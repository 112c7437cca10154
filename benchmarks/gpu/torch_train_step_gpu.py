#!/usr/bin/env python3
"""Train-step throughput of the benchmark models (models_torch.py, the same as models.h) in
PyTorch on a GPU, eager and torch.compile: the reference galley's CUDA backend is measured
against. One step: forward, cross-entropy, backward, Adam (lr 1e-3), zero grad.

Usage: torch_train_step_gpu.py --out FILE.json [--models simple fashion] [--batches 64 256]
                               [--steps 50] [--device cuda] [--budget-s S] [--no-cudnn-benchmark]

Every eager run comes before the first torch.compile run (compiling takes far longer than
timing), and the file is rewritten after each run, so a run cut short keeps what was done.
--budget-s stops starting runs once the time left would not cover one more (the estimate is the
slowest run of the same mode so far, at least 2 s eager and 20 s compiled); the runs left out are recorded as skipped. cuDNN's
autotuner is on by default (galley picks its convolution algorithms by timing them too).
"""
import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import models_torch  # noqa: E402


# The least a run takes before anything is known (torch.compile compiles forward, backward and
# the optimizer's step first).
MIN_SECONDS = {"eager": 2, "compile": 20}


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(name, batch, compiled, steps, device, amp=None):
    """amp: None (float32), "bf16" or "fp16" (autocast; fp16 with a GradScaler)."""
    torch.manual_seed(0)
    model, shape = models_torch.build(name)
    model = model.to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = torch.nn.CrossEntropyLoss()
    x = torch.randn(batch, *shape, device=device)
    y = torch.randint(0, 10, (batch,), device=device)

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(amp)
    scaler = torch.amp.GradScaler(device.type, enabled=amp == "fp16")

    def step():
        with torch.autocast(device.type, dtype=dtype or torch.bfloat16, enabled=amp is not None):
            loss = loss_fn(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)

    if compiled:
        step = torch.compile(step)
    t0 = time.perf_counter()
    for _ in range(10):
        step()
    synchronize(device)
    warmup_s = time.perf_counter() - t0
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        synchronize(device)
        times.append((time.perf_counter() - t0) / steps)
    times.sort()
    return batch / times[len(times) // 2], [batch / t for t in times], warmup_s


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--models", nargs="+", default=["simple", "fashion", "resnet"], choices=models_torch.MODELS)
    ap.add_argument("--batches", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--budget-s", type=float, default=0, help="0: no limit")
    ap.add_argument("--no-cudnn-benchmark", action="store_true")
    ap.add_argument("--amp", nargs="*", default=["resnet:256"],
                    help="MODEL:BATCH cells also run eager under bf16 and fp16 autocast")
    args = ap.parse_args()
    start = time.perf_counter()
    device = torch.device(args.device)
    torch.backends.cudnn.benchmark = not args.no_cudnn_benchmark
    if device.type == "cuda" and not torch.cuda.is_available():
        with open(args.out, "w") as f:
            json.dump({"torch": torch.__version__, "cuda": torch.version.cuda, "runs": [],
                       "error": f"torch {torch.__version__} sees no CUDA device"}, f, indent=2)
        sys.exit(f"torch_train_step_gpu.py: torch {torch.__version__} sees no CUDA device")
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else str(device)
    results = {"torch": torch.__version__, "cuda": torch.version.cuda,
               "cudnn": torch.backends.cudnn.version(), "gpu": gpu,
               "cudnn_benchmark": torch.backends.cudnn.benchmark,
               "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
               "matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
               "steps": args.steps, "blocks": 5, "warmup_steps": 10, "runs": []}
    slowest = {}  # mode -> seconds of the slowest run so far
    amp_cells = [(c.split(":")[0], int(c.split(":")[1])) for c in args.amp]
    # In order of importance: float32 eager, the autocast cells, then torch.compile.
    plan = [("eager", False, None, n, b) for n in args.models for b in args.batches]
    plan += [(f"eager_{amp}", False, amp, n, b) for amp in ("bf16", "fp16") for n, b in amp_cells]
    plan += [("compile", True, None, n, b) for n in args.models for b in args.batches]
    for mode, compiled, amp, name, batch in plan:
        run = {"model": name, "batch": batch, "mode": mode}
        left = args.budget_s - (time.perf_counter() - start)
        need = max(slowest.get(mode, 0), MIN_SECONDS["compile" if compiled else "eager"])
        if args.budget_s and left < need:
            run["skipped"] = f"time budget: {max(left, 0):.0f} s left, one {mode} run takes ~{need:.0f} s"
            print(f"torch {mode} {name} batch {batch}: skipped ({run['skipped']})", flush=True)
            results["runs"].append(run)
            continue
        t0 = time.perf_counter()
        try:
            rate, rates, warmup_s = measure(name, batch, compiled, args.steps, device, amp)
            run.update(samples_per_s=rate, samples_per_s_all=rates, warmup_s=round(warmup_s, 3))
            print(f"torch {mode} {name} batch {batch}: {rate:.0f} samples/s "
                  f"(warm-up {warmup_s:.1f} s)", flush=True)
        except Exception as e:  # torch.compile may be unavailable; record why
            run["error"] = str(e)[:300]
            print(f"torch {mode} {name} batch {batch}: failed: {run['error']}", flush=True)
        run["seconds"] = round(time.perf_counter() - t0, 3)
        slowest[mode] = max(slowest.get(mode, 0), run["seconds"])
        results["runs"].append(run)
        with open(args.out, "w") as f:  # after every run: a timeout keeps what was done
            json.dump(results, f, indent=2)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
