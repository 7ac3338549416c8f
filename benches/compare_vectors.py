"""Compares two files of little-endian f32 vector rows (embed-bench --vectors-out and
embed_st.py --vectors-out, same texts, same order): prints one line with the rows, the
minimum and mean cosine, and exits 1 when the minimum is below --min-cosine.
Usage: python3 benches/compare_vectors.py OURS THEIRS --dim 384 [--label NAME]"""
import argparse
import sys

import numpy as np


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("ours")
    parser.add_argument("theirs")
    parser.add_argument("--dim", type=int, required=True)
    parser.add_argument("--label", default="")
    parser.add_argument("--min-cosine", type=float, default=0.99)
    args = parser.parse_args()
    ours = np.fromfile(args.ours, dtype="<f4").reshape(-1, args.dim).astype(np.float64)
    theirs = np.fromfile(args.theirs, dtype="<f4").reshape(-1, args.dim).astype(np.float64)
    if ours.shape != theirs.shape:
        print(f"{args.label}: shapes differ: {ours.shape} vs {theirs.shape}")
        sys.exit(1)
    norms = np.linalg.norm(ours, axis=1) * np.linalg.norm(theirs, axis=1)
    cosine = (ours * theirs).sum(axis=1) / np.maximum(norms, 1e-12)
    worst = int(cosine.argmin())
    print(
        f"parity {args.label}: {len(cosine)} rows, min cosine {cosine.min():.6f} (row {worst}), "
        f"mean {cosine.mean():.6f}"
    )
    sys.exit(0 if cosine.min() >= args.min_cosine else 1)


if __name__ == "__main__":
    main()
