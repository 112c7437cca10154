#!/usr/bin/env python3
"""PyTorch's convolutions on the layer shapes of bench_kernels' BM_conv2d_layer_* (float32, NCHW),
timed as bench_kernels times galley's, so that run_cpu.py's conv suite can set the two side by
side.

  python3 conv_layers_torch.py --layers layers.json --threads 1 --min-time 0.5 [--seed 0]

layers.json: a list of {"key", "in", "out", "hw", "k", "stride", "bias", "pass"}, pass "forward"
(under no_grad), "backward" (the input, weight and bias gradients) or "backward (weights)" (a
stem's: weight and bias gradients, the input being data). A backward is timed alone: each call
records the forward's graph untimed, then times y.backward(gy) and drops the gradients. Padding is
(k - 1) // 2, as in the models. The layers run in an order shuffled by --seed; each is called until
--min-time seconds have passed (after one untimed call). Prints one JSON object: torch's version,
the threads, and seconds per call for each layer's key.
"""
import argparse
import json
import random
import time

import torch
import torch.nn.functional as F


def bench(layer, batch, min_time, gen):
    pad = (layer["k"] - 1) // 2
    backward = layer["pass"].startswith("backward")
    input_grad = layer["pass"] == "backward"
    x = torch.randn(batch, layer["in"], layer["hw"], layer["hw"], generator=gen).requires_grad_(input_grad)
    w = torch.randn(layer["out"], layer["in"], layer["k"], layer["k"], generator=gen).requires_grad_(backward)
    b = torch.randn(layer["out"], generator=gen).requires_grad_(backward) if layer["bias"] else None

    def forward():
        return F.conv2d(x, w, b, stride=layer["stride"], padding=pad)

    if not backward:
        def call():
            with torch.no_grad():
                forward()
            return None
    else:
        with torch.no_grad():
            gy = torch.randn(forward().shape, generator=gen)
        leaves = [t for t in (x, w, b) if t is not None and t.requires_grad]

        def call():
            y = forward()
            t0 = time.perf_counter()
            y.backward(gy)
            dt = time.perf_counter() - t0
            for t in leaves:
                t.grad = None
            return dt

    call()  # untimed: first-call set-up (oneDNN primitives, allocations)
    calls, secs, start = 0, 0.0, time.perf_counter()
    while True:
        t0 = time.perf_counter()
        dt = call()
        secs += dt if dt is not None else time.perf_counter() - t0
        calls += 1
        if time.perf_counter() - start >= min_time and calls >= 2:
            return secs / calls


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", required=True, help="JSON file: the layers to time")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--min-time", type=float, default=0.5, help="seconds of calls per layer")
    ap.add_argument("--seed", type=int, default=0, help="the order of the layers")
    a = ap.parse_args()

    torch.set_num_threads(a.threads)
    with open(a.layers) as f:
        layers = json.load(f)
    order = list(range(len(layers)))
    random.Random(a.seed).shuffle(order)
    gen = torch.Generator().manual_seed(0)
    seconds = {}
    for i in order:
        seconds[layers[i]["key"]] = bench(layers[i], a.batch, a.min_time, gen)
    print(json.dumps({"version": torch.__version__, "threads": a.threads,
                      "mkldnn": torch.backends.mkldnn.is_available(), "seconds": seconds}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
