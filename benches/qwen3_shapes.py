"""What the GPU's bf16 matrix multiplies reach on the Qwen3-0.6B layer shapes (M tokens x K
in -> N out: the fused QKV, the output projection, gate+up and down), timed with CUDA
events after a warm-up: the ceiling a Qwen3-0.6B forward could approach.
Usage: python3 benches/qwen3_shapes.py [--tokens 16384]"""
import argparse

import torch


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, nargs="+", default=[4096, 16384, 65536])
    args = parser.parse_args()
    shapes = {"qkv": (1024, 4096), "o": (2048, 1024), "gate+up": (1024, 6144), "down": (3072, 1024)}
    print("| tokens | " + " | ".join(f"{n} TFLOP/s" for n in shapes) + " | layer GEMMs TFLOP/s |")
    print("|---:|" + "---:|" * (len(shapes) + 1))
    for m in args.tokens:
        rates, total_flops, total_s = [], 0.0, 0.0
        for k, n in shapes.values():
            x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
            w = torch.randn(k, n, dtype=torch.bfloat16, device="cuda")
            for _ in range(3):
                x @ w
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(20):
                x @ w
            end.record()
            torch.cuda.synchronize()
            seconds = start.elapsed_time(end) / 1000 / 20
            flops = 2 * m * k * n
            rates.append(flops / seconds / 1e12)
            total_flops += flops
            total_s += seconds
        print(f"| {m} | " + " | ".join(f"{r:.0f}" for r in rates) + f" | {total_flops / total_s / 1e12:.0f} |")


if __name__ == "__main__":
    main()
