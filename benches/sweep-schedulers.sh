#!/usr/bin/env bash
# FIFO, ASHA and PBT on the same trials: an example sweep (by default
# examples/sweeps/wiki-topic-pbt.toml: all-MiniLM-L6-v2 embeddings of the 10,033 Wikipedia
# leads, a classifier head per trial, 16 random draws, 20 epochs) with its `[scheduler]`
# table replaced by each scheduler's, for each seed. FIFO trains every trial to the end;
# ASHA stops the weak ones at rungs 2, 4, 8 and 16 (reduction factor 2); PBT trains all 16
# and every 4 epochs the worst 4 copy one of the best 4 and perturb it. The first sweep
# embeds the articles; the others reuse its cache. Prints one row per sweep and the means.
# Needs: target/release/resident, scripts/fetch-model.sh, scripts/fetch-data.sh.
# Usage: SEEDS="7 8 9" OUT=/tmp/sweep-schedulers [CONFIG=FILE] [RESIDENT=path/to/resident]
#   benches/sweep-schedulers.sh
set -euo pipefail
cd "$(dirname "$0")/.."
seeds=${SEEDS:-7 8 9}
out=${OUT:-/tmp/sweep-schedulers}
config=${CONFIG:-examples/sweeps/wiki-topic-pbt.toml}
mkdir -p "$out"
scheduler_table() {
  case "$1" in
    fifo) printf '[scheduler]\nkind = "fifo"\nmax_epochs = 20\n' ;;
    asha) printf '[scheduler]\nkind = "asha"\nmax_epochs = 20\ngrace_epochs = 2\nreduction_factor = 2\n' ;;
    pbt) printf '[scheduler]\nkind = "pbt"\nmax_epochs = 20\nperturbation_interval = 4\n' ;;
  esac
}
for seed in $seeds; do
  for scheduler in fifo asha pbt; do
    dir="$out/$scheduler-$seed"
    rm -rf "$dir" && mkdir -p "$dir"
    # The declaration without its [scheduler] table (up to the next table), then this one's.
    awk '/^\[scheduler\]/{skip=1; next} /^\[/{skip=0} !skip' "$config" |
      sed -e "s/^seed = .*/seed = $seed/" -e "s|^output = .*|output = \"$dir\"|" \
        -e "s/^name = .*/name = \"schedulers-$scheduler-$seed\"/" > "$out/$scheduler-$seed.toml"
    scheduler_table "$scheduler" >> "$out/$scheduler-$seed.toml"
    [[ -d "$out/cache" ]] && cp -r "$out/cache" "$dir/"
    "${RESIDENT:-target/release/resident}" sweep --config "$out/$scheduler-$seed.toml" > "$dir.log" 2>&1
    [[ -d "$out/cache" ]] || cp -r "$dir/cache" "$out/cache"
  done
done
python3 - "$out" "$seeds" <<'PY'
import json, statistics, sys
out, seeds = sys.argv[1], sys.argv[2].split()
print("| scheduler | seed | trials | best metric | mean of best 5 | median trial | epochs trained | train s | wall s |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
means = {}
for scheduler in ("fifo", "asha", "pbt"):
    for seed in seeds:
        d = f"{out}/{scheduler}-{seed}"
        summary = json.load(open(f"{d}/summary.json"))
        results = [json.loads(l) for l in open(f"{d}/results.jsonl")]
        metrics = sorted((r["metric"] for r in results if r.get("metric") is not None), reverse=True)
        top5, median = statistics.mean(metrics[:5]), statistics.median(metrics)
        train = sum(r.get("train_s", 0.0) for r in results)
        row = (summary["best_metric"], top5, median, summary["epochs_trained"], train, summary["wall_s"])
        means.setdefault(scheduler, []).append(row)
        print(f"| {scheduler} | {seed} | {len(results)} | {row[0]:.4f} | {top5:.4f} | {median:.4f} | {row[3]} | {train:.1f} | {row[5]:.1f} |")
for scheduler, rows in means.items():
    m = [statistics.mean(r[i] for r in rows) for i in range(6)]
    print(f"| {scheduler}, mean over seeds | | | {m[0]:.4f} | {m[1]:.4f} | {m[2]:.4f} | {m[3]:.0f} | {m[4]:.1f} | {m[5]:.1f} |")
PY
