#!/usr/bin/env bash
# TPE against random search on the same trial budget: an example sweep (by default the
# README's topic probe, examples/sweeps/wiki-topic-probe.toml: all-MiniLM-L6-v2 embeddings
# of the 10,033 Wikipedia leads, a classifier head per trial, ASHA; CONFIG= another, such
# as examples/sweeps/wiki-retrieval.toml) with `trials` and `seed` set here, once with
# `algorithm = "random"` and once with "tpe", for each seed. The first sweep embeds the
# articles; the others reuse its cache. Prints one row per sweep and the means.
# Needs: target/release/resident, scripts/fetch-model.sh, scripts/fetch-data.sh.
# Usage: TRIALS=32 SEEDS="7 8 9" OUT=/tmp/sweep-search [CONFIG=FILE] [RESIDENT=path/to/resident]
#   benches/sweep-search.sh
set -euo pipefail
cd "$(dirname "$0")/.."
trials=${TRIALS:-32}
seeds=${SEEDS:-7 8 9}
out=${OUT:-/tmp/sweep-search}
config=${CONFIG:-examples/sweeps/wiki-topic-probe.toml}
mkdir -p "$out"
for seed in $seeds; do
  for algorithm in random tpe; do
    dir="$out/$algorithm-$seed"
    rm -rf "$dir" && mkdir -p "$dir"
    sed -e "s/^trials = .*/trials = $trials/" -e "s/^seed = .*/seed = $seed/" \
      -e "s/^algorithm = .*/algorithm = \"$algorithm\"/" -e "s|^output = .*|output = \"$dir\"|" \
      -e "s/^name = .*/name = \"search-$algorithm-$seed\"/" \
      "$config" > "$out/$algorithm-$seed.toml"
    # A declaration without a `[search]` table gets one.
    grep -q '^algorithm = ' "$out/$algorithm-$seed.toml" ||
      printf '[search]\nalgorithm = "%s"\n' "$algorithm" >> "$out/$algorithm-$seed.toml"
    [[ -d "$out/cache" ]] && cp -r "$out/cache" "$dir/"
    "${RESIDENT:-target/release/resident}" sweep --config "$out/$algorithm-$seed.toml" > "$dir.log" 2>&1
    [[ -d "$out/cache" ]] || cp -r "$dir/cache" "$out/cache"
  done
done
python3 - "$out" "$seeds" <<'PY'
import json, statistics, sys
out, seeds = sys.argv[1], sys.argv[2].split()
print("| search | seed | trials | best metric | mean of best 5 | median trial | trained to the end | wall s |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
means = {}
for algorithm in ("random", "tpe"):
    for seed in seeds:
        d = f"{out}/{algorithm}-{seed}"
        summary = json.load(open(f"{d}/summary.json"))
        results = [json.loads(l) for l in open(f"{d}/results.jsonl")]
        metrics = sorted((r["metric"] for r in results if r.get("metric") is not None), reverse=True)
        full = sum(1 for r in results if not r["stopped_early"] and r.get("error") is None)
        top5, median = statistics.mean(metrics[:5]), statistics.median(metrics)
        means.setdefault(algorithm, []).append((summary["best_metric"], top5, median))
        print(f"| {algorithm} | {seed} | {len(results)} | {summary['best_metric']:.4f} | {top5:.4f} | {median:.4f} | {full} | {summary['wall_s']:.1f} |")
for algorithm, rows in means.items():
    mean = [statistics.mean(r[i] for r in rows) for i in range(3)]
    print(f"| {algorithm}, mean over seeds | | | {mean[0]:.4f} | {mean[1]:.4f} | {mean[2]:.4f} | | |")
PY
