#!/usr/bin/env python3
"""Checks that weight files cross between galley and PyTorch in both directions.

Usage: interop.py DIR

Reads DIR/galley_model.safetensors (a model state galley wrote) and DIR/galley_io.safetensors
(an input and galley's output for it), loads the weights into the equivalent torch.nn.Module
with strict key matching, and checks that PyTorch computes the same output. Then writes
DIR/torch_model.safetensors (a PyTorch model's state_dict, one tensor in bfloat16 and one in
float16 as mixed-precision checkpoints have) and DIR/torch_io.safetensors (input and PyTorch's
output) for galley to check the other way.
"""
import json
import os
import struct
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_reference import SimpleCNN  # noqa: E402  the design's model, same parameter names

TO_TORCH = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "I64": torch.int64}
FROM_TORCH = {v: k for k, v in TO_TORCH.items()}


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        t = torch.frombuffer(bytearray(data[base + b:base + end]), dtype=TO_TORCH[e["dtype"]])
        out[name] = t.reshape(e["shape"]).clone()
    return out


def write_safetensors(path, tensors):
    header, chunks, offset = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous().cpu()
        raw = t.view(torch.int16) if t.dtype in (torch.float16, torch.bfloat16) else t
        data = raw.numpy().tobytes()
        header[name] = {"dtype": FROM_TORCH[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        chunks.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(chunks))
    os.replace(tmp, path)


def main():
    d = sys.argv[1]
    torch.set_num_threads(1)
    model = SimpleCNN()
    model.load_state_dict(read_safetensors(os.path.join(d, "galley_model.safetensors")), strict=True)
    io = read_safetensors(os.path.join(d, "galley_io.safetensors"))
    with torch.no_grad():
        y = model(io["x"])
    err = (y - io["y"]).abs().max().item()
    scale = io["y"].abs().max().item()
    print(f"galley -> torch: max |difference| {err:.3g} (outputs up to {scale:.3g})")
    if err > 1e-5 * max(1.0, scale):
        sys.exit(f"galley's weights give different outputs in PyTorch: {err}")

    torch.manual_seed(1234)
    other = SimpleCNN()
    state = other.state_dict()
    state["conv.weight"] = state["conv.weight"].to(torch.bfloat16)
    state["fc.bias"] = state["fc.bias"].to(torch.float16)
    other.load_state_dict({k: v.float() for k, v in state.items()})  # the values galley will see
    x = torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        y = other(x)
    write_safetensors(os.path.join(d, "torch_model.safetensors"), state)
    write_safetensors(os.path.join(d, "torch_io.safetensors"), {"x": x, "y": y})
    print("torch -> galley: wrote torch_model.safetensors (with bfloat16 and float16 tensors)")


if __name__ == "__main__":
    main()
