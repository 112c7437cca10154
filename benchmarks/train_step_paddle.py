#!/usr/bin/env python3
"""Train-step throughput in PaddlePaddle (CPU) for the models of models.h, the framework galley's
API comes from. Same step as train_step_torch.py: forward, CrossEntropyLoss, backward,
Adam(lr=1e-3) step, clear_grad.

Paddle's default initialisers differ from PyTorch's; every conv and linear layer here is
initialised as in PyTorch (weights and biases uniform in +-1/sqrt(fan_in)) so that all
frameworks train the same model.

  python3 train_step_paddle.py --model vgg --batch 64 --threads 1 --warmup 5 --iters 20 --repeats 5 [--json]
"""
import argparse
import json
import math
import os
import statistics
import sys
import time

import paddle
import paddle.nn as nn

MODELS = ("simple", "fashion", "vgg")
INPUT = {"simple": (3, 32, 32), "fashion": (1, 28, 28), "vgg": (3, 32, 32)}


def _attrs(fan_in):
    b = 1.0 / math.sqrt(fan_in)
    init = nn.initializer.Uniform(-b, b)
    return paddle.ParamAttr(initializer=init), paddle.ParamAttr(initializer=init)


def _conv(cin, cout, pad):
    w, b = _attrs(cin * 9)
    return nn.Conv2D(cin, cout, 3, padding=pad, weight_attr=w, bias_attr=b)


def _fc(fin, fout):
    w, b = _attrs(fin)
    return nn.Linear(fin, fout, weight_attr=w, bias_attr=b)


def build(name):
    """Returns (model, input shape of one sample); the layers of models.h."""
    if name == "simple":
        layers = [_conv(3, 64, 0), nn.ReLU(), nn.MaxPool2D(2), nn.Flatten(1), _fc(64 * 15 * 15, 10)]
    elif name == "fashion":
        layers = [_conv(1, 32, 1), nn.ReLU(), nn.MaxPool2D(2), _conv(32, 64, 1), nn.ReLU(), nn.MaxPool2D(2),
                  nn.Flatten(1), _fc(64 * 7 * 7, 128), nn.ReLU(), _fc(128, 10)]
    elif name == "vgg":
        layers = [_conv(3, 32, 1), nn.ReLU(), _conv(32, 32, 1), nn.ReLU(), nn.MaxPool2D(2),
                  _conv(32, 64, 1), nn.ReLU(), _conv(64, 64, 1), nn.ReLU(), nn.MaxPool2D(2),
                  _conv(64, 128, 1), nn.ReLU(), nn.MaxPool2D(2), nn.Flatten(1), _fc(128 * 4 * 4, 10)]
    else:
        raise ValueError(f"unknown model {name!r}")
    return nn.Sequential(*layers), INPUT[name]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=MODELS, default="simple")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    a = ap.parse_args()

    paddle.set_device("cpu")
    # Paddle's CPU kernels take their thread count from OpenMP (the driver also sets
    # OMP_NUM_THREADS); set_num_threads covers its math library where the build exposes it.
    core = getattr(paddle, "base", None) and getattr(paddle.base, "core", None)
    if core is not None and hasattr(core, "set_num_threads"):
        core.set_num_threads(a.threads)
    paddle.seed(0)
    model, shape = build(a.model)
    opt = paddle.optimizer.Adam(learning_rate=1e-3, parameters=model.parameters())
    loss_fn = nn.CrossEntropyLoss()
    x = paddle.randn([a.batch, *shape])
    y = paddle.randint(0, 10, [a.batch], dtype="int64")

    def step():
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        opt.clear_grad()
        return loss

    for _ in range(a.warmup):
        step()
    times = []
    for _ in range(a.repeats):
        t0 = time.perf_counter()
        for _ in range(a.iters):
            loss = step()
        float(loss)
        times.append(time.perf_counter() - t0)
    rates = [a.batch * a.iters / t for t in times]
    med = statistics.median(rates)
    result = {"impl": "paddle", "version": paddle.__version__, "model": a.model, "batch": a.batch,
              "threads": a.threads, "warmup": a.warmup, "iters": a.iters, "repeats": a.repeats,
              "samples_per_s": med, "samples_per_s_all": rates, "step_ms": 1e3 * a.batch / med,
              "final_loss": float(loss)}
    if a.json:
        print(json.dumps(result))
    else:
        print(f"paddle {paddle.__version__} {a.model} batch={a.batch} threads={a.threads}: "
              f"{med:.1f} samples/s ({result['step_ms']:.2f} ms/step, loss {result['final_loss']:.4f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
