"""Writes an all-mpnet-base-v2-shaped model with random weights (f16 safetensors, the real
config and tokenizer copied from SRC) for GPU throughput and f16 parity runs where the real
weights (438 MB) cannot travel. transformers' own initialisation (normal, std 0.02), seeded;
both engines load the same file, so their vectors are comparable, and speed is real.
Needs torch, transformers and safetensors.
Usage: python3 benches/mpnet_random.py --config-dir DIR_WITHOUT_WEIGHTS --out DIR"""
import argparse
import os
import shutil

import torch
from safetensors.torch import save_file
from transformers import MPNetConfig, MPNetModel


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--config-dir", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    shutil.copytree(args.config_dir, args.out, dirs_exist_ok=True)
    torch.manual_seed(0)
    config = MPNetConfig.from_pretrained(args.config_dir)
    model = MPNetModel(config, add_pooling_layer=False).eval()
    tensors = {
        name: (t.half() if t.is_floating_point() else t).contiguous()
        for name, t in model.state_dict().items()
    }
    save_file(tensors, os.path.join(args.out, "model.safetensors"))
    print(f"wrote {args.out}: {sum(t.numel() for t in tensors.values()) / 1e6:.0f}M parameters")


if __name__ == "__main__":
    main()
