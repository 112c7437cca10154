#!/usr/bin/env python3
"""Runs loader_bench (galley) and loader_torch.py (PyTorch) with the same settings, one after the
other in the same run, and prints a Markdown table of both for docs/benchmarks/loader.md.

Usage: run_loader.py [--bench PATH] [--python PATH] [loader_bench options...]
  --bench   the loader_bench executable (default: build/benchmarks/loader_bench)
  --python  an interpreter that can import torch (default: /usr/bin/python3)
Other options (--dataset, --workers, --step-ms, --batch-size, --batches, --data) go to both.
"""
import argparse
import json
import os
import subprocess
import sys

here = os.path.dirname(os.path.abspath(__file__))


def run(cmd):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", default=os.path.join(here, "..", "build", "benchmarks",
                                                    "loader_bench"))
    ap.add_argument("--python", default="/usr/bin/python3")
    a, rest = ap.parse_known_args()
    rows = run([a.bench, "--json"] + rest)
    rows += run([a.python, os.path.join(here, "loader_torch.py"), "--json"] + rest)
    key = lambda r: (r["dataset"], r["step_ms"], r["workers"], r["framework"] != "galley")
    print("| data | step | workers | framework | samples/s | starvation | wait per batch |")
    print("| --- | ---: | ---: | --- | ---: | ---: | ---: |")
    for r in sorted(rows, key=key):
        print(f"| {r['dataset']} | {r['step_ms']:g} ms | {r['workers']} | {r['framework']} | "
              f"{r['samples_per_s']:,.0f} | {100 * r['starvation']:.2f}% | "
              f"{r['wait_ms_per_batch']:.3f} ms |")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
