#!/usr/bin/env python3
"""Writes PyTorch reference tensors for galley's parity test (tests/test_parity.cpp).

Usage: make_reference.py --out DIR

Each op gets one safetensors file, DIR/<op>.safetensors, holding one or more cases. A
tensor is named "<case>.<role>": the inputs ("a", "b", "x", "weight", ...), the output
"out", the upstream gradient "grad_out" and the gradient of every float input
("grad_a", "grad_x", ...). Settings an op needs (stride, dim, reduction, ...) are stored
as small int64/float32 tensors of the same case ("<case>.stride", "<case>.p", ...), so
the C++ side reads them instead of repeating them.

The activations (gelu, gelu_tanh, silu, sigmoid, tanh, leaky_relu) share their inputs: every
file holds the same cases on the same values (activation_inputs()).

Beyond single ops:
  simple_cnn.safetensors     the SimpleCNN (Conv2d(3,64,3) -> relu -> MaxPool2d(2) ->
                             flatten(1) -> Linear(64*15*15,10)): initial parameters under
                             galley's names ("conv.weight", ...), 20 batches "x0".."x19",
                             "y0".."y19", the 20 losses of 20 Adam(lr=1e-3) steps ("losses",
                             each recorded before its step) and the final parameters
                             ("final.conv.weight", ...).
  optim_<name>.safetensors   a tiny Linear(6, 4) trained a few steps with SGD (Nesterov),
                             AdamW, Adam (amsgrad + weight decay), SGD and AdamW with
                             maximize (AdamW's weight decay left at its default); initial and
                             final parameters, batches and losses; hyper-parameters as tensors.
  lr_scheduler.safetensors   learning-rate sequences of StepLR and CosineAnnealingLR.
  convert.safetensors        float32 -> bfloat16 / float16 rounding ("float32.x" and the
                             results' bits, "float32.bfloat16_bits", ...) and every 16-bit
                             pattern widened to float32 ("widen.bits", "widen.from_bfloat16",
                             "widen.from_float16", as float32 bits).
  resnet.safetensors         galley::models::ResNet at width 4, 2 stages of 2 blocks (RESNET):
                             the initial state ("init.<name>", parameters and buffers), 20
                             batches, the first step's logits "out0", running statistics
                             ("step0.<name>") and gradients ("grad0.<name>"), the 20 losses of
                             SGD (momentum 0.9, weight decay 5e-4), the final state
                             ("final.<name>"), and an eval batch with its logits and loss.
  batch_norm_layers.safetensors  BatchNorm2d [4, 3, 5, 5] and BatchNorm1d [6, 4]: the first
                             training step's output and gradients ("<case>.out0", "grad_x",
                             "grad_weight", ...), the running statistics after a second step
                             and the eval output ("out2").
  lr_scheduler_more.safetensors  learning-rate sequences ("<case>.lrs") of LinearLR,
                             OneCycleLR (cos/linear, two/three phases), ReduceLROnPlateau (min/max,
                             rel/abs, cooldown, min_lr; driven by "<case>.metrics") and
                             SequentialLR (LinearLR warm-up, then CosineAnnealingLR, ...).

The safetensors files are written by hand (8-byte little-endian header length, JSON
header, raw little-endian data), so only torch is needed. Everything is float32 on the
CPU with one thread and fixed seeds; the script computes every file twice and checks that
both runs agree bit for bit before writing anything.
"""

import argparse
import json
import os
import struct
import sys
import zlib

import torch
import torch.nn.functional as F

# The ResNet of galley/models/resnet.h, defined once for the benchmarks and the parity suite.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "benchmarks"))
from models_torch import ResNet  # noqa: E402

DTYPES = {torch.float32: "F32", torch.int64: "I64"}


# ----------------------------------------------------------------------------- safetensors

def safetensors_bytes(tensors):
    """Serialises a {name: tensor} dict (float32 / int64 CPU tensors) to safetensors."""
    header = {}
    chunks = []
    offset = 0
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous().cpu()
        if t.dtype not in DTYPES:
            raise TypeError(f"{name}: unsupported dtype {t.dtype}")
        arr = t.numpy()
        data = arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes()
        header[name] = {"dtype": DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        chunks.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)  # pad so the data starts 8-byte aligned
    return struct.pack("<Q", len(text)) + text + b"".join(chunks)


def write_atomic(path, payload):
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(payload)
    os.replace(tmp, path)


# ----------------------------------------------------------------------------- helpers

def seed_for(name):
    """A fixed seed per file, so adding a case to one op leaves the others unchanged."""
    return zlib.crc32(name.encode("utf-8")) & 0x7FFFFFFF


def leaf(t):
    return t.detach().clone().requires_grad_(True)


def away_from_zero(shape, margin):
    """randn values with |v| >= margin (where a kink or a pole would make gradients flaky)."""
    t = torch.randn(shape)
    return torch.where(t.abs() < margin, torch.sign(t + 1e-12) * (margin + t.abs()), t)


def i64(value):
    return torch.tensor(value, dtype=torch.int64)


def f32(value):
    return torch.tensor(value, dtype=torch.float32)


class Cases:
    """Collects the tensors of one file."""

    def __init__(self):
        self.tensors = {}

    def put(self, case, role, t):
        key = f"{case}.{role}"
        assert key not in self.tensors, key
        self.tensors[key] = t.detach().clone()

    def run(self, case, fn, inputs, settings=None):
        """Runs fn(**inputs) with autograd and stores inputs, out, grad_out, grad_<input>.

        Float inputs get gradients; int64 inputs (labels) are stored as they are."""
        leaves = {k: (leaf(v) if v.is_floating_point() else v) for k, v in inputs.items()}
        out = fn(**leaves)
        for k, v in inputs.items():
            self.put(case, k, v)
        for k, v in (settings or {}).items():
            self.put(case, k, v)
        self.put(case, "out", out)
        if not out.is_floating_point():
            return
        grad_out = torch.randn(out.shape)
        out.backward(grad_out)
        self.put(case, "grad_out", grad_out)
        for k, v in leaves.items():
            if v.is_floating_point():
                assert v.grad is not None, f"{case}: no gradient for {k}"
                self.put(case, "grad_" + k, v.grad)


# ----------------------------------------------------------------------------- op cases

BINARY_SHAPES = [
    ("same", [4, 3, 5], [4, 3, 5]),
    ("bcast_inner", [4, 3, 5], [3, 1]),      # b broadcast over dims 0 and 2
    ("bcast_row", [8, 6], [6]),              # [N, C] with [C]
    ("bcast_both", [4, 1, 5], [3, 1]),       # both sides broadcast -> [4, 3, 5]
    ("bcast_left", [5], [2, 3, 5]),          # a is the smaller one
    ("bcast_one", [3, 4], [1]),
]


def binary_op(fn, divisor=False):
    def build(c):
        for case, sa, sb in BINARY_SHAPES:
            a = torch.randn(sa)
            b = away_from_zero(sb, 0.5) if divisor else torch.randn(sb)
            c.run(case, lambda a, b: fn(a, b), {"a": a, "b": b})
    return build


def build_scalar(c):
    c.run("add", lambda a: a + 2.5, {"a": torch.randn(4, 3, 5)}, {"s": f32(2.5)})
    c.run("add_neg", lambda a: a + (-0.75), {"a": torch.randn(7)}, {"s": f32(-0.75)})
    c.run("mul", lambda a: a * -1.7, {"a": torch.randn(4, 3, 5)}, {"s": f32(-1.7)})
    c.run("mul_small", lambda a: a * 0.125, {"a": torch.randn(6, 2)}, {"s": f32(0.125)})


def unary_op(fn, make_input):
    def build(c):
        for case, shape in [("3d", [4, 3, 5]), ("2d", [8, 6]), ("1d", [17])]:
            c.run(case, lambda x: fn(x), {"x": make_input(shape)})
    return build


def positive(shape):
    return torch.rand(shape) * 2.9 + 0.1  # [0.1, 3)


def build_pow(c):
    for case, p, make in [("square", 2.0, torch.randn), ("cube", 3.0, torch.randn),
                          ("sqrt", 0.5, positive), ("inverse", -1.0, positive),
                          ("frac", 1.5, positive)]:
        c.run(case, lambda x: torch.pow(x, p), {"x": make([4, 3, 5])}, {"p": f32(p)})


ACTIVATION_SEED = 20240917


def activation_inputs():
    """The inputs every activation file shares (each file draws them from the same seed): randn
    scaled by 3 in three shapes (1037 elements: the CPU kernels' 256-element blocks and a short
    one), and a case of fixed values from -30 to 30 with exact zeros, where sigmoid and tanh
    saturate and gelu, silu and leaky_relu reach their limits."""
    g = torch.Generator().manual_seed(ACTIVATION_SEED)
    inputs = [(case, torch.randn(shape, generator=g) * 3.0)
              for case, shape in [("3d", [4, 3, 5]), ("2d", [8, 6]), ("1d_odd", [1037])]]
    fixed = [-30.0, -20.0, -15.0, -10.0, -9.0, -5.0, -3.0, -1.0, -1e-3, -0.0, 0.0, 1e-3, 1.0,
             3.0, 5.0, 9.0, 10.0, 15.0, 20.0, 30.0]
    inputs.append(("saturate", torch.tensor(fixed)))
    return inputs


def activation_op(fn, slopes=None):
    """Forward and backward of fn on activation_inputs(); with `slopes`, one set of cases per
    negative_slope (stored as "<case>.negative_slope")."""
    def build(c):
        for case, x in activation_inputs():
            if slopes is None:
                c.run(case, lambda x: fn(x), {"x": x})
                continue
            for slope in slopes:
                name = f"{case}_slope{str(slope).replace('.', '_')}"
                c.run(name, lambda x: fn(x, slope), {"x": x}, {"negative_slope": f32(slope)})
    return build


def build_matmul(c):
    for case, (m, k, n) in [("small", (5, 7, 3)), ("row", (1, 4, 6)), ("wide", (16, 32, 8)),
                            ("col", (9, 11, 1))]:
        c.run(case, lambda a, b: a @ b, {"a": torch.randn(m, k), "b": torch.randn(k, n)})


def build_linear(c):
    for case, xshape, out, bias in [("2d_bias", [8, 12], 5, True), ("2d_nobias", [8, 12], 5, False),
                                    ("3d_bias", [3, 4, 12], 7, True),
                                    ("3d_nobias", [3, 4, 12], 7, False)]:
        inputs = {"x": torch.randn(xshape), "weight": torch.randn(out, xshape[-1]) * 0.3}
        if bias:
            inputs["bias"] = torch.randn(out)
            c.run(case, lambda x, weight, bias: F.linear(x, weight, bias), inputs)
        else:
            c.run(case, lambda x, weight: F.linear(x, weight), inputs)


CONV_CASES = [
    # name, x shape, out channels, kernel, stride, padding, dilation, groups, bias
    ("basic", [2, 3, 8, 8], 4, 3, 1, 0, 1, 1, True),
    ("nobias", [2, 3, 8, 8], 4, 3, 1, 0, 1, 1, False),
    ("pad1", [2, 3, 7, 7], 5, 3, 1, 1, 1, 1, True),
    ("stride2", [2, 3, 9, 9], 4, 3, 2, 0, 1, 1, True),
    ("stride2_pad1", [2, 4, 8, 8], 6, 3, 2, 1, 1, 1, True),
    ("pad2_k5", [1, 2, 6, 6], 3, 5, 1, 2, 1, 1, True),
    ("dilation2", [2, 3, 10, 10], 4, 3, 1, 0, 2, 1, True),
    ("dilation2_pad2", [2, 3, 9, 9], 4, 3, 1, 2, 2, 1, False),
    ("groups2", [2, 4, 7, 7], 6, 3, 1, 1, 1, 2, True),
    ("groups2_stride2_nobias", [2, 4, 8, 8], 4, 3, 2, 0, 1, 2, False),
    ("k1", [2, 5, 4, 4], 3, 1, 1, 0, 1, 1, True),
    ("all", [2, 4, 11, 11], 6, 3, 2, 2, 2, 2, True),
    ("simple_cnn", [2, 3, 32, 32], 64, 3, 1, 0, 1, 1, True),  # the SimpleCNN's conv
    # 3x3 "same" convolutions of 32 channels and more: galley's Winograd path on AVX-512 hosts,
    # weight gradient included; on planes of 13 and wider (tiles across the lanes) and narrower.
    ("winograd_wide", [2, 32, 14, 14], 32, 3, 1, 1, 1, 1, True),
    ("winograd_narrow", [3, 32, 7, 7], 48, 3, 1, 1, 1, 1, False),
]


def build_conv2d(c):
    for case, xs, out, k, stride, pad, dil, groups, bias in CONV_CASES:
        cin = xs[1]
        bound = 1.0 / (cin // groups * k * k) ** 0.5
        inputs = {"x": torch.randn(xs),
                  "weight": torch.empty(out, cin // groups, k, k).uniform_(-bound, bound)}
        geometry = dict(stride=stride, padding=pad, dilation=dil, groups=groups)
        settings = {"stride": i64(stride), "padding": i64(pad), "dilation": i64(dil),
                    "groups": i64(groups)}
        if bias:
            inputs["bias"] = torch.empty(out).uniform_(-bound, bound)
            c.run(case, lambda x, weight, bias: F.conv2d(x, weight, bias, **geometry), inputs,
                  settings)
        else:
            c.run(case, lambda x, weight: F.conv2d(x, weight, None, **geometry), inputs, settings)


def distinct_randn(shape):
    """Values without ties (so the argmax of every pooling window is unique)."""
    n = 1
    for s in shape:
        n *= s
    return (torch.randperm(n).float() / n * 6.0 - 3.0).reshape(shape)


def build_max_pool2d(c):
    for case, xs, k, stride, pad in [("k2s2", [2, 3, 8, 8], 2, 2, 0),
                                     ("k2s2_odd", [2, 3, 9, 7], 2, 2, 0),
                                     ("k3s2p1", [2, 3, 9, 9], 3, 2, 1),
                                     ("k3s2p1_even", [2, 2, 8, 8], 3, 2, 1),
                                     ("k3s1", [2, 3, 7, 7], 3, 1, 0),
                                     ("simple_cnn", [2, 16, 30, 30], 2, 2, 0)]:
        c.run(case, lambda x: F.max_pool2d(x, k, stride, pad), {"x": distinct_randn(xs)},
              {"kernel_size": i64(k), "stride": i64(stride), "padding": i64(pad)})


def build_flatten(c):
    for case, xs, start, end in [("from1", [2, 3, 4, 5], 1, -1), ("all", [2, 3, 4, 5], 0, -1),
                                 ("middle", [2, 3, 4, 5], 1, 2), ("last2", [3, 4, 5], -2, -1)]:
        c.run(case, lambda x: torch.flatten(x, start, end), {"x": torch.randn(xs)},
              {"start": i64(start), "end": i64(end)})


def reduction_op(fn):
    def build(c):
        c.run("all", lambda x: fn(x), {"x": torch.randn(4, 3, 5)})  # no "dim": every element
        for case, xs, dim, keep in [("dim0", [4, 3, 5], 0, False), ("dim1", [4, 3, 5], 1, False),
                                    ("dim_last_keep", [4, 3, 5], -1, True),
                                    ("dim1_keep", [4, 3, 5], 1, True), ("dim0_2d", [6, 7], 0, False),
                                    ("dim1_2d", [6, 7], 1, False)]:
            c.run(case, lambda x: fn(x, dim, keepdim=keep), {"x": torch.randn(xs)},
                  {"dim": i64(dim), "keepdim": i64(int(keep))})
    return build


def softmax_op(fn):
    def build(c):
        for case, xs, dim in [("2d_dim1", [6, 10], 1), ("2d_dim_last", [6, 10], -1),
                              ("3d_dim1", [3, 4, 5], 1), ("3d_dim_last", [3, 4, 5], -1),
                              ("large", [4, 7], 1), ("offset", [4, 7], 1)]:
            x = torch.randn(xs) * (20.0 if case == "large" else 2.0)  # "large" needs max-shift
            if case == "offset":  # logits near 1e6: log-softmax must not round m + log(s)
                x = x + 1e6
            c.run(case, lambda x: fn(x, dim=dim), {"x": x}, {"dim": i64(dim)})
    return build


REDUCTIONS = {"mean": 0, "sum": 1, "none": 2}


def build_cross_entropy(c):
    n, classes = 12, 10
    cases = [("mean", "mean", 0.0, -100, False), ("sum", "sum", 0.0, -100, False),
             ("none", "none", 0.0, -100, False),
             ("smooth_mean", "mean", 0.1, -100, False), ("smooth_sum", "sum", 0.1, -100, False),
             ("smooth_none", "none", 0.1, -100, False),
             ("ignore_mean", "mean", 0.0, -100, True), ("ignore_sum", "sum", 0.0, -100, True),
             ("ignore_none", "none", 0.0, -100, True),
             ("ignore3_mean", "mean", 0.0, 3, True),
             ("smooth_ignore_mean", "mean", 0.1, -100, True),
             ("smooth_ignore_none", "none", 0.1, 5, True)]
    for case, reduction, smoothing, ignore, with_ignored in cases:
        logits = torch.randn(n, classes) * 2.0
        labels = torch.randint(0, classes, (n,))
        if with_ignored:
            labels[torch.tensor([1, 4, 9])] = ignore
        c.run(case,
              lambda logits, labels: F.cross_entropy(logits, labels, reduction=reduction,
                                                     label_smoothing=smoothing,
                                                     ignore_index=ignore),
              {"logits": logits, "labels": labels},
              {"reduction": i64(REDUCTIONS[reduction]), "label_smoothing": f32(smoothing),
               "ignore_index": i64(ignore)})


def build_argmax(c):
    for case, xs, dim, keep in [("2d_last", [5, 7], -1, False), ("2d_dim0", [5, 7], 0, False),
                                ("2d_keep", [5, 7], 1, True), ("3d_dim1", [3, 4, 5], 1, False)]:
        c.run(case, lambda x: torch.argmax(x, dim=dim, keepdim=keep), {"x": distinct_randn(xs)},
              {"dim": i64(dim), "keepdim": i64(int(keep))})


def build_cat(c):
    for case, shapes, dim in [("dim0", [[2, 3], [4, 3]], 0),
                              ("dim1_three", [[2, 1, 4], [2, 3, 4], [2, 2, 4]], 1),
                              ("dim_last", [[3, 2], [3, 5]], -1)]:
        inputs = {f"t{k}": torch.randn(s) for k, s in enumerate(shapes)}
        c.run(case, lambda **t: torch.cat([t[f"t{k}"] for k in range(len(t))], dim), inputs,
              {"dim": i64(dim)})


def build_stack(c):
    for case, shape, n, dim in [("dim0", [3, 4], 2, 0), ("dim_last", [2, 3], 3, -1),
                                ("middle", [2, 3, 4], 2, 1)]:
        inputs = {f"t{k}": torch.randn(shape) for k in range(n)}
        c.run(case, lambda **t: torch.stack([t[f"t{k}"] for k in range(len(t))], dim), inputs,
              {"dim": i64(dim)})


def split_rejoined(x, split, dim):
    """The pieces of torch.split, piece k times k + 1, joined again in reverse order: the
    output shows every piece and the gradient reaches every one (both exactly)."""
    parts = torch.split(x, split, dim)
    return torch.cat([p * (k + 1) for k, p in enumerate(parts)][::-1], dim)


def build_split(c):
    for case, xs, split, dim in [("size", [4, 6], 2, 1), ("size_uneven", [2, 7], 3, -1),
                                 ("sizes", [5, 3], [1, 0, 4], 0), ("sizes_dim1", [2, 6, 2], [4, 2], 1)]:
        setting = {"sizes": i64(split)} if isinstance(split, list) else {"split_size": i64(split)}
        setting["dim"] = i64(dim)
        c.run(case, lambda x: split_rejoined(x, split, dim), {"x": torch.randn(xs)}, setting)


def build_permute(c):
    for case, xs, dims in [("2d", [3, 5], [1, 0]), ("3d", [2, 3, 4], [2, 0, 1]),
                           ("4d", [2, 3, 4, 5], [3, 1, 0, 2]), ("negative", [2, 3, 4], [-1, 0, -2])]:
        c.run(case, lambda x: x.permute(dims).contiguous(), {"x": torch.randn(xs)},
              {"dims": i64(dims)})


def build_views(c):
    """narrow, select and transpose (views, made contiguous), with negative dims and indices;
    the gradient flows back into the viewed input."""
    cases = [("narrow_0", [5, 3, 4], ("narrow", 0, 1, 3)),
             ("narrow_last", [2, 3, 7], ("narrow", -1, 2, 4)),
             ("narrow_empty", [4, 3], ("narrow", 0, 2, 0)),
             ("select_1", [3, 4, 5], ("select", 1, 2)),
             ("select_negative", [3, 4, 5], ("select", -1, -2)),
             ("transpose_01", [3, 4, 5], ("transpose", 0, 1)),
             ("transpose_negative", [2, 3, 4, 5], ("transpose", -1, 1))]
    for case, xs, (op, a, b, *rest) in cases:
        if op == "narrow":
            fn = lambda x: x.narrow(a, b, rest[0]).contiguous()  # noqa: E731
            settings = {"op": i64(0), "a": i64(a), "b": i64(b), "length": i64(rest[0])}
        elif op == "select":
            fn = lambda x: x.select(a, b).contiguous()  # noqa: E731
            settings = {"op": i64(1), "a": i64(a), "b": i64(b)}
        else:
            fn = lambda x: x.transpose(a, b).contiguous()  # noqa: E731
            settings = {"op": i64(2), "a": i64(a), "b": i64(b)}
        c.run(case, fn, {"x": torch.randn(xs)}, settings)


def build_batch_norm(c):
    """F.batch_norm: batch statistics with and without affine, fixed running statistics (eval),
    a fused relu, other momenta and eps; the running statistics are settings (they get no
    gradient), and after a training call their updated values are kept too (running_*_after)."""
    for case, xs, training, affine, relu, momentum, eps in [
            ("train_2d", [4, 3, 5, 5], True, True, False, 0.1, 1e-5),
            ("train_1d", [6, 4], True, True, False, 0.1, 1e-5),
            ("train_3d_no_affine", [3, 4, 7], True, False, False, 0.1, 1e-5),
            ("train_2d_momentum_eps", [4, 3, 5, 5], True, True, False, 0.35, 1e-2),
            ("train_1d_momentum_one", [6, 4], True, True, False, 1.0, 1e-3),
            ("eval_2d", [4, 3, 5, 5], False, True, False, 0.1, 1e-5),
            ("eval_2d_eps", [4, 3, 5, 5], False, True, False, 0.1, 0.5),
            ("eval_1d_relu", [6, 4], False, True, True, 0.1, 1e-5)]:
        ch = xs[1]
        rm, rv = torch.randn(ch) * 0.5, torch.rand(ch) + 0.5
        rm_after, rv_after = rm.clone(), rv.clone()
        inputs = {"x": torch.randn(xs) * 2.0 + 0.5}
        if affine:
            inputs.update(weight=torch.randn(ch), bias=torch.randn(ch))

        def fn(x, weight=None, bias=None):
            y = F.batch_norm(x, rm_after, rv_after, weight, bias, training=training,
                             momentum=momentum, eps=eps)
            return torch.relu(y) if relu else y
        settings = {"running_mean": rm, "running_var": rv, "training": i64(int(training)),
                    "relu": i64(int(relu)), "momentum": f32(momentum), "eps": f32(eps)}
        if training:  # c.run stores the settings after fn has updated them
            settings.update(running_mean_after=rm_after, running_var_after=rv_after)
        c.run(case, fn, inputs, settings)


def build_batch_norm_layers(c):
    """BatchNorm2d on [4, 3, 5, 5] and BatchNorm1d on [6, 4] with random affine parameters, and
    BatchNorm2d with the other options (momentum None: the cumulative average; eps and momentum;
    no affine; no running statistics): the first training step's output and gradients, the
    running statistics after a second training step, and the output in eval mode. The options
    are the case's settings (momentum -1 for None)."""
    for case, xs, make, options in [
            ("bn2d", [4, 3, 5, 5], torch.nn.BatchNorm2d, {}),
            ("bn1d", [6, 4], torch.nn.BatchNorm1d, {}),
            ("bn2d_cumulative", [4, 3, 5, 5], torch.nn.BatchNorm2d, {"momentum": None}),
            ("bn2d_eps_momentum", [4, 3, 5, 5], torch.nn.BatchNorm2d,
             {"eps": 1e-2, "momentum": 0.3}),
            ("bn2d_no_affine", [4, 3, 5, 5], torch.nn.BatchNorm2d, {"affine": False}),
            ("bn1d_no_running", [6, 4], torch.nn.BatchNorm1d, {"track_running_stats": False})]:
        ch = xs[1]
        m = make(ch, **options)
        momentum = options.get("momentum", 0.1)
        c.put(case, "momentum", f32(-1.0 if momentum is None else momentum))
        c.put(case, "eps", f32(options.get("eps", 1e-5)))
        c.put(case, "affine", i64(int(m.affine)))
        c.put(case, "track_running_stats", i64(int(m.track_running_stats)))
        if m.affine:
            with torch.no_grad():
                m.weight.copy_(torch.randn(ch))
                m.bias.copy_(torch.randn(ch))
            c.put(case, "weight", m.weight)
            c.put(case, "bias", m.bias)
        x0, x1, x2 = torch.randn(xs) * 2.0 + 0.5, torch.randn(xs) - 1.0, torch.randn(xs)
        x = leaf(x0)
        out = m(x)
        grad_out = torch.randn(out.shape)
        out.backward(grad_out)
        for role, t in [("x0", x0), ("out0", out), ("grad_out", grad_out), ("grad_x", x.grad)]:
            c.put(case, role, t)
        if m.affine:
            c.put(case, "grad_weight", m.weight.grad)
            c.put(case, "grad_bias", m.bias.grad)
        c.put(case, "x1", x1)
        c.put(case, "out1", m(x1))
        if m.track_running_stats:
            c.put(case, "running_mean", m.running_mean)
            c.put(case, "running_var", m.running_var)
            c.put(case, "num_batches_tracked", m.num_batches_tracked)
        m.eval()
        c.put(case, "x2", x2)
        c.put(case, "out2", m(x2))


def build_avg_pool2d(c):
    for case, xs, k, stride, pad, include_pad, ceil in [
            ("k2s2", [2, 3, 8, 8], 2, 2, 0, True, False),
            ("k3s2p1", [2, 3, 9, 9], 3, 2, 1, True, False),
            ("k3s2p1_exclude", [2, 3, 9, 8], 3, 2, 1, False, False),
            ("k3s1p1_exclude", [2, 2, 7, 6], 3, 1, 1, False, False),
            ("k3s2p1_ceil", [2, 3, 8, 7], 3, 2, 1, True, True),
            ("k3s2p1_ceil_exclude", [2, 3, 8, 7], 3, 2, 1, False, True),
            ("k2s2_ceil_odd", [1, 4, 7, 9], 2, 2, 0, True, True),
            ("k4s3p2", [2, 2, 10, 11], 4, 3, 2, True, False)]:
        c.run(case, lambda x: F.avg_pool2d(x, k, stride, pad, ceil_mode=ceil,
                                           count_include_pad=include_pad),
              {"x": torch.randn(xs)},
              {"kernel_size": i64(k), "stride": i64(stride), "padding": i64(pad),
               "count_include_pad": i64(int(include_pad)), "ceil_mode": i64(int(ceil))})


def build_adaptive_avg_pool2d(c):
    for case, xs, out in [("global", [4, 16, 7, 7], [1, 1]), ("global_odd", [2, 3, 5, 9], [1, 1]),
                          ("divisible", [2, 3, 8, 8], [4, 2]),
                          ("non_divisible", [2, 3, 7, 10], [3, 4]),
                          ("non_divisible_tall", [1, 2, 13, 5], [5, 3]),
                          ("upsample", [1, 2, 3, 2], [5, 3])]:
        c.run(case, lambda x: F.adaptive_avg_pool2d(x, out), {"x": torch.randn(xs)},
              {"output_size": i64(out)})


OPS = {
    "add": binary_op(torch.add),
    "sub": binary_op(torch.sub),
    "mul": binary_op(torch.mul),
    "div": binary_op(torch.div, divisor=True),
    "scalar": build_scalar,
    "neg": unary_op(torch.neg, torch.randn),
    "exp": unary_op(torch.exp, torch.randn),
    "log": unary_op(torch.log, positive),
    "pow": build_pow,
    "relu": unary_op(torch.relu, lambda s: away_from_zero(s, 0.05)),
    "gelu": activation_op(F.gelu),
    "gelu_tanh": activation_op(lambda x: F.gelu(x, approximate="tanh")),
    "silu": activation_op(F.silu),
    "sigmoid": activation_op(torch.sigmoid),
    "tanh": activation_op(torch.tanh),
    "leaky_relu": activation_op(F.leaky_relu, slopes=[0.01, 0.2]),
    "matmul": build_matmul,
    "linear": build_linear,
    "conv2d": build_conv2d,
    "max_pool2d": build_max_pool2d,
    "flatten": build_flatten,
    "sum": reduction_op(torch.sum),
    "mean": reduction_op(torch.mean),
    "softmax": softmax_op(torch.softmax),
    "log_softmax": softmax_op(torch.log_softmax),
    "cross_entropy": build_cross_entropy,
    "argmax": build_argmax,
    "cat": build_cat,
    "stack": build_stack,
    "split": build_split,
    "permute": build_permute,
    "views": build_views,
    "batch_norm": build_batch_norm,
    "avg_pool2d": build_avg_pool2d,
    "adaptive_avg_pool2d": build_adaptive_avg_pool2d,
}


# ----------------------------------------------------------------------------- training

class SimpleCNN(torch.nn.Module):
    """The SimpleCNN of galley's design, with the same parameter names."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 64, 3)
        self.pool = torch.nn.MaxPool2d(2)
        self.fc = torch.nn.Linear(64 * 15 * 15, 10)

    def forward(self, x):
        return self.fc(torch.flatten(self.pool(torch.relu(self.conv(x))), 1))


CNN_STEPS = 20
CNN_BATCH = 16


def build_simple_cnn(c):
    t = c.tensors
    model = SimpleCNN()
    for name, p in model.named_parameters():
        t[name] = p.detach().clone()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = torch.nn.CrossEntropyLoss()
    losses = []
    for step in range(CNN_STEPS):
        x = torch.randn(CNN_BATCH, 3, 32, 32)
        y = torch.randint(0, 10, (CNN_BATCH,))
        t[f"x{step}"], t[f"y{step}"] = x, y
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        losses.append(loss.item())
        loss.backward()
        opt.step()
    t["losses"] = torch.tensor(losses, dtype=torch.float32)
    for name, p in model.named_parameters():
        t["final." + name] = p.detach().clone()


# The residual model: galley::models::ResNet with 2 stages of 2 blocks at width 4 (identity
# shortcuts and one projection), 3 x 8 x 8 inputs, 20 SGD steps with momentum and weight decay
# in training mode, then eval.
RESNET = {"in_channels": 3, "num_classes": 10, "width": 4, "stages": 2, "blocks": 2}
RESNET_STEPS = 20
RESNET_BATCH = 8


def build_resnet(c):
    t = c.tensors
    model = ResNet(**RESNET)
    with torch.no_grad():  # BatchNorm affine parameters away from PyTorch's 1 and 0
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.2, 0.2)
    for name, v in model.state_dict().items():
        t["init." + name] = v.clone()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    losses = []
    for step in range(RESNET_STEPS):
        x = torch.randn(RESNET_BATCH, RESNET["in_channels"], 8, 8) * 1.5 + 0.2
        y = torch.randint(0, RESNET["num_classes"], (RESNET_BATCH,))
        t[f"x{step}"], t[f"y{step}"] = x, y
        opt.zero_grad()
        out = model(x)
        loss = F.cross_entropy(out, y)
        losses.append(loss.item())
        loss.backward()
        if step == 0:  # the first step in full: logits, the state it updated, every gradient
            t["out0"] = out.detach().clone()
            for name, v in model.state_dict().items():
                if "running" in name:
                    t["step0." + name] = v.clone()
            for name, p in model.named_parameters():
                t["grad0." + name] = p.grad.clone()
        opt.step()
    t["losses"] = torch.tensor(losses, dtype=torch.float32)
    for name, v in model.state_dict().items():
        t["final." + name] = v.clone()
    model.eval()
    x = torch.randn(RESNET_BATCH, RESNET["in_channels"], 8, 8) * 1.5 + 0.2
    y = torch.randint(0, RESNET["num_classes"], (RESNET_BATCH,))
    out = model(x)
    t["eval_x"], t["eval_y"], t["eval_out"] = x, y, out.detach().clone()
    t["eval_loss"] = F.cross_entropy(out, y).detach().reshape(1)


OPT_STEPS = 6


def tiny_run(make_optimizer, settings):
    def build(c):
        t = c.tensors
        model = torch.nn.Linear(6, 4)
        for name, p in model.named_parameters():
            t[name] = p.detach().clone()
        opt = make_optimizer(model.parameters())
        losses = []
        for step in range(OPT_STEPS):
            x = torch.randn(8, 6)
            y = torch.randint(0, 4, (8,))
            t[f"x{step}"], t[f"y{step}"] = x, y
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            losses.append(loss.item())
            loss.backward()
            opt.step()
        t["losses"] = torch.tensor(losses, dtype=torch.float32)
        for name, p in model.named_parameters():
            t["final." + name] = p.detach().clone()
        for k, v in settings.items():
            t[k] = f32(v)
    return build


OPTIMIZERS = {
    "optim_sgd_nesterov": tiny_run(
        lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-4),
        {"lr": 0.1, "momentum": 0.9, "weight_decay": 1e-4}),
    "optim_adamw": tiny_run(
        lambda ps: torch.optim.AdamW(ps, lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2),
        {"lr": 1e-2, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 1e-2}),
    "optim_adam_amsgrad": tiny_run(
        lambda ps: torch.optim.Adam(ps, lr=1e-2, betas=(0.8, 0.99), eps=1e-8, weight_decay=1e-2,
                                    amsgrad=True),
        {"lr": 1e-2, "beta1": 0.8, "beta2": 0.99, "eps": 1e-8, "weight_decay": 1e-2}),
    # maximize: ascent on the loss, the negated gradient taken before the weight decay.
    "optim_sgd_maximize": tiny_run(
        lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, dampening=0.2, weight_decay=1e-2,
                                   maximize=True),
        {"lr": 0.05, "momentum": 0.9, "dampening": 0.2, "weight_decay": 1e-2}),
    # AdamW's default weight decay (1e-2) with the rate given: galley leaves it unset too.
    "optim_adamw_maximize": tiny_run(
        lambda ps: torch.optim.AdamW(ps, lr=1e-2, maximize=True),
        {"lr": 1e-2}),
}

LR_STEPS = 10


def build_lr_scheduler(c):
    t = c.tensors
    for name, make, settings in [
            ("step", lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=3, gamma=0.5),
             {"step_size": i64(3), "gamma": f32(0.5)}),
            ("cosine", lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=8, eta_min=1e-4),
             {"t_max": i64(8), "eta_min": f32(1e-4)})]:
        opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
        sched = make(opt)
        lrs = []
        for _ in range(LR_STEPS):
            lrs.append(opt.param_groups[0]["lr"])  # the rate in force for this period
            opt.step()
            sched.step()
        t[f"{name}.lrs"] = torch.tensor(lrs, dtype=torch.float32)
        t[f"{name}.base_lr"] = f32(0.1)
        for k, v in settings.items():
            t[f"{name}.{k}"] = v


LRS = torch.optim.lr_scheduler

# Metric sequences for ReduceLROnPlateau: a loss that improves, stalls, wobbles and improves
# again, and an accuracy that does the same upwards.
PLATEAU_LOSS = [1.0, 0.8, 0.7, 0.69, 0.695, 0.68, 0.7, 0.71, 0.6, 0.59, 0.595, 0.594, 0.6,
                0.58, 0.5, 0.49, 0.49, 0.5, 0.51, 0.52, 0.4, 0.41, 0.405, 0.41, 0.42, 0.43,
                0.399, 0.398, 0.41, 0.42]
PLATEAU_ACC = [0.1, 0.3, 0.5, 0.52, 0.51, 0.53, 0.53, 0.52, 0.6, 0.61, 0.605, 0.6, 0.7, 0.7,
               0.69, 0.71, 0.72, 0.72, 0.8, 0.79, 0.8, 0.81, 0.8, 0.8, 0.9, 0.85, 0.86, 0.87,
               0.9, 0.91]


def lr_case(t, name, base_lr, make, settings, periods, metrics=None):
    """Stores the rate in force for each of `periods` periods of the schedule make(opt) makes
    (stepped between periods, with metrics[i] for ReduceLROnPlateau) and its settings."""
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=base_lr)
    sched = make(opt)
    lrs = []
    for e in range(periods):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        if e + 1 == periods:
            break
        if metrics is None:
            sched.step()
        else:
            sched.step(metrics[e])
    t[f"{name}.lrs"] = torch.tensor(lrs, dtype=torch.float32)
    t[f"{name}.base_lr"] = f32(base_lr)
    if metrics is not None:
        t[f"{name}.metrics"] = torch.tensor(metrics[:periods - 1], dtype=torch.float32)
    for k, v in settings.items():
        t[f"{name}.{k}"] = i64(v) if isinstance(v, int) else f32(v)


def build_lr_scheduler_more(c):
    t = c.tensors
    for name, kw in [("linear_warmup", dict(start_factor=0.25, end_factor=1.0, total_iters=4)),
                     ("linear_decay", dict(start_factor=1.0, end_factor=0.1, total_iters=6)),
                     ("linear_default", dict())]:
        full = dict(dict(start_factor=1.0 / 3, end_factor=1.0, total_iters=5), **kw)
        lr_case(t, name, 0.1, lambda o, kw=kw: LRS.LinearLR(o, **kw), full, 10)

    for name, kw in [
            ("onecycle_cos", dict(max_lr=0.5, total_steps=20)),
            ("onecycle_linear", dict(max_lr=0.5, total_steps=20, anneal_strategy="linear",
                                     pct_start=0.25, div_factor=10.0, final_div_factor=100.0)),
            ("onecycle_cos_3p", dict(max_lr=0.5, total_steps=20, three_phase=True)),
            ("onecycle_linear_3p", dict(max_lr=0.2, epochs=4, steps_per_epoch=5, pct_start=0.4,
                                        anneal_strategy="linear", three_phase=True))]:
        settings = {k: (int(v) if isinstance(v, bool) else v) for k, v in kw.items()
                    if k != "anneal_strategy"}
        settings["linear"] = int(kw.get("anneal_strategy") == "linear")
        total = kw.get("total_steps") or kw["epochs"] * kw["steps_per_epoch"]
        lr_case(t, name, 0.1, lambda o, kw=kw: LRS.OneCycleLR(o, cycle_momentum=False, **kw),
                settings, total + 1)  # rates exist for periods 0..total_steps

    for name, metrics, kw in [
            ("plateau_min_rel", PLATEAU_LOSS, dict(factor=0.5, patience=2, threshold=1e-2)),
            ("plateau_min_abs_cooldown", PLATEAU_LOSS,
             dict(factor=0.5, patience=1, threshold=0.05, threshold_mode="abs", cooldown=2,
                  min_lr=0.02)),
            ("plateau_max_rel", PLATEAU_ACC,
             dict(mode="max", factor=0.3, patience=2, threshold=0.01, cooldown=1, min_lr=1e-3)),
            ("plateau_max_abs", PLATEAU_ACC,
             dict(mode="max", factor=0.5, patience=0, threshold=0.02, threshold_mode="abs",
                  min_lr=0.01)),
            ("plateau_default", PLATEAU_LOSS, dict())]:
        settings = {k: v for k, v in kw.items() if k not in ("mode", "threshold_mode")}
        settings["max"] = int(kw.get("mode") == "max")
        settings["abs"] = int(kw.get("threshold_mode") == "abs")
        lr_case(t, name, 0.1, lambda o, kw=kw: LRS.ReduceLROnPlateau(o, **kw), settings,
                len(metrics) + 1, metrics)

    def warmup_cosine(o):
        return LRS.SequentialLR(o, [LRS.LinearLR(o, start_factor=0.1, total_iters=3),
                                    LRS.CosineAnnealingLR(o, T_max=7, eta_min=1e-3)],
                                milestones=[3])

    def three_stages(o):
        return LRS.SequentialLR(o, [LRS.LinearLR(o, start_factor=0.2, total_iters=4),
                                    LRS.CosineAnnealingLR(o, T_max=5),
                                    LRS.LinearLR(o, start_factor=1.0, end_factor=0.1,
                                                 total_iters=4)],
                                milestones=[4, 9])

    lr_case(t, "seq_warmup_cosine", 0.1, warmup_cosine, {"milestone": 3, "t_max": 7}, 13)
    lr_case(t, "seq_three", 0.1, three_stages, {"milestone0": 4, "milestone1": 9}, 16)


def float_bits(t):
    """The float32 bits of t as int64 (the file format has no unsigned 32-bit type)."""
    return t.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF


def half_bits(t):
    """The 16 bits of a bfloat16 / float16 tensor as int64."""
    return t.contiguous().view(torch.int16).to(torch.int64) & 0xFFFF


def conversion_inputs():
    """float32 values that exercise every rounding case of float32 -> bfloat16 / float16: each
    16-bit value exactly, the ties half-way between neighbours (round to even) and a hair either
    side of them, float32 subnormals, float16's subnormal and overflow ranges, infinities,
    and random values over the whole exponent range."""
    patterns = torch.arange(0, 1 << 16, dtype=torch.int64)
    values = []
    for kind in (torch.bfloat16, torch.float16):
        exact = patterns.to(torch.int16).view(kind).to(torch.float32)
        finite = exact[torch.isfinite(exact)]
        values.append(finite)
        ordered = torch.sort(torch.unique(finite.to(torch.float64)))[0]
        ties = (ordered[1:] + ordered[:-1]) / 2  # exact in float64, exact in float32 here
        ties = ties.to(torch.float32)
        values += [ties, torch.nextafter(ties, torch.tensor(float("inf"))),
                   torch.nextafter(ties, torch.tensor(float("-inf")))]
    values.append(torch.tensor([1e-45, -1e-45, 1e-40, 3e-39, 65504.0, 65519.996, 65520.0,
                                65536.0, 1e6, -1e6, 3.4e38, float("inf"), float("-inf"), 0.0,
                                -0.0]))
    values.append(torch.randn(20000) * torch.exp2(torch.randint(-140, 127, (20000,)).float()))
    return torch.cat(values)


def build_convert(c):
    x = conversion_inputs()
    c.put("float32", "x", x)
    c.put("float32", "bfloat16_bits", half_bits(x.to(torch.bfloat16)))
    c.put("float32", "float16_bits", half_bits(x.to(torch.float16)))
    # Back: every 16-bit pattern to float32 (NaN patterns included: their float32 bits too).
    patterns = torch.arange(0, 1 << 16, dtype=torch.int64)
    c.put("widen", "bits", patterns)
    c.put("widen", "from_bfloat16", float_bits(patterns.to(torch.int16).view(torch.bfloat16)
                                               .to(torch.float32)))
    c.put("widen", "from_float16", float_bits(patterns.to(torch.int16).view(torch.float16)
                                              .to(torch.float32)))


BUILDERS = dict(OPS)
BUILDERS["convert"] = build_convert
BUILDERS["simple_cnn"] = build_simple_cnn
BUILDERS["resnet"] = build_resnet
BUILDERS.update(OPTIMIZERS)
BUILDERS["lr_scheduler"] = build_lr_scheduler
BUILDERS["lr_scheduler_more"] = build_lr_scheduler_more
BUILDERS["batch_norm_layers"] = build_batch_norm_layers


# ----------------------------------------------------------------------------- main

def generate(name):
    torch.manual_seed(seed_for(name))
    c = Cases()
    BUILDERS[name](c)
    return safetensors_bytes(c.tensors)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="directory for the .safetensors files")
    parser.add_argument("--only", nargs="*", help="write only these files (names without suffix)")
    args = parser.parse_args()

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    os.makedirs(args.out, exist_ok=True)
    names = args.only or list(BUILDERS)
    for name in names:
        if name not in BUILDERS:
            sys.exit(f"make_reference.py: unknown file '{name}' (known: {', '.join(BUILDERS)})")
    for name in names:
        first = generate(name)
        if generate(name) != first:
            sys.exit(f"make_reference.py: {name} is not deterministic (two runs differ)")
        write_atomic(os.path.join(args.out, name + ".safetensors"), first)
    total = sum(os.path.getsize(os.path.join(args.out, n + ".safetensors")) for n in names)
    print(f"make_reference.py: wrote {len(names)} files ({total / 1e6:.1f} MB) to {args.out} "
          f"(torch {torch.__version__})")


if __name__ == "__main__":
    main()
