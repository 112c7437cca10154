#!/usr/bin/env python3
"""PyTorch DataLoader peer of loader_bench: the same datasets, batch size, transforms and
simulated step, measured the same way (warm-up epoch, then the consumer's wait per batch).

Usage: loader_torch.py [--dataset fashion|cifar|all] [--workers 0,2] [--step-ms 0,5,20]
                       [--batch-size N] [--batches N] [--data DIR] [--json]
"""
import argparse
import gzip
import json
import os
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, TensorDataset

CIFAR_MEAN = torch.tensor([0.4914, 0.4822, 0.4465]).view(3, 1, 1)
CIFAR_STD = torch.tensor([0.2470, 0.2435, 0.2616]).view(3, 1, 1)


def read_idx(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        raw = f.read()
    magic = int.from_bytes(raw[0:4], "big")
    dims = magic & 0xFF
    shape = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def find(root, stem):
    for ext in ("", ".gz"):
        p = os.path.join(root, stem + ext)
        if os.path.exists(p):
            return p
    return None


def fashion(root):
    img, lbl = find(root, "train-images-idx3-ubyte"), find(root, "train-labels-idx1-ubyte")
    if img and lbl:
        x = torch.from_numpy(read_idx(img).astype(np.float32) / 255.0).unsqueeze(1)
        x = (x - 0.2860) / 0.3530
        y = torch.from_numpy(read_idx(lbl).astype(np.int64))
        return TensorDataset(x, y), "Fashion-MNIST files"
    g = torch.Generator().manual_seed(1)
    return (TensorDataset(torch.randn(60000, 1, 28, 28, generator=g), torch.arange(60000) % 10),
            "random images of Fashion-MNIST's shape (files not found)")


class CifarShaped(Dataset):
    """50000 random uint8 [3, 32, 32] images; per sample: to float, crop 4, flip, normalise
    (torchvision's RandomCrop(32, 4), RandomHorizontalFlip, Normalize without torchvision)."""

    def __init__(self):
        g = torch.Generator().manual_seed(12345)
        self.x = torch.randint(0, 256, (50000, 3, 32, 32), dtype=torch.uint8, generator=g)
        self.y = torch.arange(50000) % 10

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        x = self.x[i].float().div_(255.0)
        x = F.pad(x, (4, 4, 4, 4))
        oy, ox = torch.randint(0, 9, (2,)).tolist()
        x = x[:, oy:oy + 32, ox:ox + 32]
        if torch.rand(()) < 0.5:
            x = x.flip(-1)
        return (x - CIFAR_MEAN) / CIFAR_STD, self.y[i]


def run(ds, workers, step_ms, batch_size, batches):
    loader = DataLoader(ds, batch_size=batch_size, shuffle=True, num_workers=workers,
                        persistent_workers=workers > 0,
                        generator=torch.Generator().manual_seed(1))
    for _ in loader:  # warm-up epoch: workers started
        pass
    want = batches or (min(100, len(loader)) if step_ms > 0 else len(loader))
    done, samples, wait = 0, 0, 0.0
    t0 = time.perf_counter()
    while done < want:
        it = iter(loader)
        while done < want:
            w0 = time.perf_counter()
            try:
                x, y = next(it)
            except StopIteration:
                break
            wait += time.perf_counter() - w0
            samples += y.numel()
            done += 1
            if step_ms > 0:
                time.sleep(step_ms / 1e3)
        del it
    wall = time.perf_counter() - t0
    return dict(batches=done, samples_per_s=samples / wall, starvation=wait / wall,
                wait_ms_per_batch=1e3 * wait / done)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dataset", default="all")
    ap.add_argument("--workers", default="0,2")
    ap.add_argument("--step-ms", default="0,5,20")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--batches", type=int, default=0)
    ap.add_argument("--data", default=os.environ.get("GALLEY_FASHION_MNIST_DIR",
                                                     "/usr/share/datasets/fashion-mnist"))
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(1)  # as in a DataLoader worker; the step is simulated
    cases = []
    if a.dataset in ("fashion", "all"):
        cases.append(("fashion",) + fashion(a.data))
    if a.dataset in ("cifar", "all"):
        cases.append(("cifar", CifarShaped(), "random uint8 [3, 32, 32]; to float, crop 4, "
                      "flip, normalise"))
    if not a.json:
        print(f"{'dataset':8} {'workers':>7} {'step':>7} {'batches':>8} {'samples/s':>12} "
              f"{'starvation':>11} {'wait/batch':>10}")
    for name, ds, _ in cases:
        for step in [float(s) for s in a.step_ms.split(",")]:
            for w in [int(s) for s in a.workers.split(",")]:
                r = run(ds, w, step, a.batch_size, a.batches)
                if a.json:
                    print(json.dumps(dict(framework="pytorch", dataset=name, workers=w,
                                          step_ms=step, batch_size=a.batch_size, **r)), flush=True)
                else:
                    print(f"{name:8} {w:7d} {step:5g}ms {r['batches']:8d} "
                          f"{r['samples_per_s']:12.0f} {100 * r['starvation']:10.2f}% "
                          f"{r['wait_ms_per_batch']:8.3f}ms", flush=True)
    if not a.json:
        for name, _, source in cases:
            print(f"{name}: {source}")


if __name__ == "__main__":
    main()
