#!/usr/bin/env python3
"""Writes the PyTorch references of galley's mixed-precision tests (tests/test_amp.cpp):
tests/data/autocast_reference.json and tests/data/grad_scaler_reference.json.

Usage: amp_reference.py [--out DIR]   (needs torch >= 2.3, for torch.amp.GradScaler("cpu"))

autocast_reference.json: the SimpleCNN of galley's design trained 20 Adam steps (lr 1e-3) on
batches of 16, the forward and the loss under torch.autocast("cpu", dtype=torch.bfloat16),
backward and step outside: the losses, the first step's logits, samples of the first step's
gradients and of the final parameters, and every final parameter's sum and sum of squares.
Inputs, labels and initial parameters come from a counter-based generator that the C++ test
repeats exactly (splitmix64 of seed + index; see hashed_uniform), so the file holds only results.

grad_scaler_reference.json: a Linear(4, 2) trained 14 steps with SGD (lr 0.1) under
torch.amp.GradScaler("cpu") with init_scale 1024 and growth_interval 3, with Inf and NaN written
into one gradient at steps 3, 6 and 7 (after backward, before the scaler's step): the initial
parameters, every batch, the injections, and after each step the scale, the growth tracker,
whether the optimizer stepped and the parameters.

Both files are committed, unlike the other parity references (made at test time by
make_reference.py with the system's torch): the CPU GradScaler is newer than that torch (1.13),
and torch 1.13 computes bfloat16 convolution gradients on the CPU with a large error (up to 8% of
the largest element against the same computation in float64; torch 2.x is within one bfloat16
step).
"""

import argparse
import json
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_reference import SimpleCNN  # noqa: E402  the design's model, same parameter names

CNN_STEPS = 20
CNN_BATCH = 16
SAMPLE_STRIDE = 97  # every 97th element of a tensor goes into the file


def hashed_uniform(seed, n):
    """n values in [-1, 1): u = (splitmix64(seed + i) >> 40) / 2^24, value = 2u - 1 (exact in
    float32)."""
    with np.errstate(over="ignore"):
        z = np.arange(n, dtype=np.uint64) + np.uint64(seed)
        z = z + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    u = (z >> np.uint64(40)).astype(np.float64) / float(1 << 24)
    return 2.0 * u - 1.0


def hashed_tensor(seed, shape, scale):
    n = math.prod(shape)
    return torch.from_numpy((hashed_uniform(seed, n) * scale).astype(np.float32)).reshape(shape)


def hashed_labels(seed, n, classes):
    u = (hashed_uniform(seed, n) + 1.0) * 0.5
    return torch.from_numpy(np.minimum((u * classes).astype(np.int64), classes - 1))


# Each parameter is uniform in [-1/sqrt(fan_in), 1/sqrt(fan_in)) (PyTorch's default bound).
INIT = [("conv.weight", 1, 27), ("conv.bias", 2, 27), ("fc.weight", 3, 14400), ("fc.bias", 4, 14400)]


def sample(t):
    return t.detach().float().flatten()[::SAMPLE_STRIDE].tolist()


SCALER_STEPS = 14
INJECT = {3: ("weight", (0, 0), float("inf")), 6: ("bias", (1,), float("nan")),
          7: ("weight", (1, 2), float("-inf"))}
OPTIONS = {"init_scale": 1024.0, "growth_factor": 2.0, "backoff_factor": 0.5,
           "growth_interval": 3}


def write(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f)
        f.write("\n")
    print(f"amp_reference.py: wrote {path} (torch {torch.__version__})")


def autocast_reference():
    model = SimpleCNN()
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, seed, fan_in in INIT:
            params[name].copy_(hashed_tensor(seed, params[name].shape, 1.0 / math.sqrt(fan_in)))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    out = {"torch": torch.__version__, "steps": CNN_STEPS, "batch": CNN_BATCH,
           "sample_stride": SAMPLE_STRIDE, "init": [list(i) for i in INIT], "losses": []}
    for step in range(CNN_STEPS):
        x = hashed_tensor(1000 + 2 * step, (CNN_BATCH, 3, 32, 32), 1.0)
        y = hashed_labels(1001 + 2 * step, CNN_BATCH, 10)
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(x)
            loss = F.cross_entropy(logits, y)
        assert logits.dtype == torch.bfloat16 and loss.dtype == torch.float32
        out["losses"].append(loss.item())
        loss.backward()
        if step == 0:
            out["out0"] = logits.detach().float().flatten().tolist()
            out["grad0"] = {n: sample(p.grad) for n, p in params.items()}
        opt.step()
    out["final"] = {n: sample(p) for n, p in params.items()}
    out["final_sum"] = {n: p.detach().double().sum().item() for n, p in params.items()}
    out["final_sumsq"] = {n: (p.detach().double() ** 2).sum().item() for n, p in params.items()}
    return out


def grad_scaler_reference():
    torch.manual_seed(1234)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", **OPTIONS)
    params = dict(model.named_parameters())
    out = {"torch": torch.__version__, "options": OPTIONS, "lr": 0.1,
           "init": {n: p.detach().flatten().tolist() for n, p in params.items()},
           "steps": []}
    for step in range(SCALER_STEPS):
        x = torch.randn(5, 4)
        y = torch.randint(0, 2, (5,))
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        record = {"x": x.flatten().tolist(), "y": y.tolist(), "loss": loss.item()}
        if step in INJECT:
            name, index, value = INJECT[step]
            params[name].grad[index] = value
            record["inject"] = {"param": name, "index": list(index), "value": str(value)}
        before = {n: p.detach().clone() for n, p in params.items()}
        scaler.step(opt)
        scaler.update()
        stepped = any(not torch.equal(before[n], p.detach()) for n, p in params.items())
        record.update({"scale": scaler.get_scale(), "growth_tracker": scaler._growth_tracker.item(),
                       "stepped": stepped,
                       "params": {n: p.detach().flatten().tolist() for n, p in params.items()}})
        out["steps"].append(record)
    out["state_dict"] = {k: (v.item() if torch.is_tensor(v) else v)
                         for k, v in scaler.state_dict().items()}
    return out


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.normpath(os.path.join(here, "..", "data")))
    args = parser.parse_args()
    torch.set_num_threads(1)
    write(os.path.join(args.out, "autocast_reference.json"), autocast_reference())
    write(os.path.join(args.out, "grad_scaler_reference.json"), grad_scaler_reference())


if __name__ == "__main__":
    main()
