#!/usr/bin/env python3
"""Our users' reference embedding job, estimated from one measured row.

The job (the seeds' plan): 250,010 Wikipedia-length items, Qwen3-Embedding-0.6B, 512 tokens
each, on 16 A6000s, planned at 50-100 items/s per GPU (3-5 minutes). Reads `embed-bench`'s
table row for the Qwen3-0.6B shape on items cut at 512 tokens (stdin), the GPU's name, and
prints items/s here, items/s per A6000 scaled by dense bf16 peak, and the job's time on 16
A6000s. Scaling by peak assumes the same MFU on both GPUs: an estimate, said as one.
"""

import argparse
import sys

# Dense bf16 tensor-core peaks, TFLOP/s (NVIDIA data sheets, without sparsity).
PEAKS = {
    "H200": 989.0,
    "H100": 989.0,
    "A100": 312.0,
    "L40S": 362.0,
    "L4": 121.0,
    "A6000": 154.8,
}
ITEMS = 250_010
GPUS = 16
A6000 = PEAKS["A6000"]


def peak_of(name: str) -> float:
    for key, peak in PEAKS.items():
        if key.lower() in name.lower():
            return peak
    sys.exit(f"no bf16 peak known for the GPU {name!r}: add it to PEAKS")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--gpu", required=True, help="the GPU's name (nvidia-smi)")
    args = parser.parse_args()
    rows = [line for line in sys.stdin if line.startswith("|") and "---" not in line]
    if not rows:
        sys.exit("no embed-bench row on stdin")
    cells = [cell.strip() for cell in rows[-1].strip().strip("|").split("|")]
    docs, seconds, docs_per_s = int(cells[2]), float(cells[3]), float(cells[4])
    peak = peak_of(args.gpu)
    per_a6000 = docs_per_s * A6000 / peak
    job_s = ITEMS / (per_a6000 * GPUS)
    print()
    print("| reference job (250,010 items x 512 tokens, Qwen3-0.6B shape, bf16) | value |")
    print("|---|---:|")
    print(f"| measured here: {args.gpu} ({peak:g} TFLOP/s bf16), {docs} items in {seconds:.1f} s | {docs_per_s:,.0f} items/s |")
    print(f"| per A6000, scaled by bf16 peak ({A6000:g} / {peak:g}) | {per_a6000:,.0f} items/s |")
    print(f"| the whole job on {GPUS} A6000s | {job_s / 60:.1f} min ({job_s:.0f} s) |")
    print("| goal | >= 100 items/s per A6000, under 3 min |")


if __name__ == "__main__":
    main()
