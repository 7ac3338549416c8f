"""Sums an Nsight Compute CSV (one row per kernel launch, metric gpu__time_duration.sum)
by kernel name and prints the kernels that take the most GPU time, as a markdown table.

Usage: python3 benches/kernel_table.py ncu.csv [--top 15]
"""

import argparse
import collections
import csv
import io


def rows(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    # ncu prints its own log lines ("==PROF==") before the CSV header.
    start = text.find('"ID"')
    if start < 0:
        raise SystemExit(f"{path}: no CSV header (did ncu profile any kernel?)")
    return csv.DictReader(io.StringIO(text[start:]))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("csv")
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args()
    total_ns = collections.Counter()
    launches = collections.Counter()
    for row in rows(args.csv):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        name = row["Kernel Name"].split("(")[0][:60]
        total_ns[name] += float(row["Metric Value"].replace(",", ""))
        launches[name] += 1
    everything = sum(total_ns.values())
    print(f"GPU time in kernels: {everything / 1e6:.1f} ms over {sum(launches.values())} launches")
    print("| kernel | launches | ms | share |")
    print("|---|---:|---:|---:|")
    for name, ns in total_ns.most_common(args.top):
        print(f"| `{name}` | {launches[name]} | {ns / 1e6:.2f} | {100 * ns / everything:.1f}% |")


if __name__ == "__main__":
    main()
