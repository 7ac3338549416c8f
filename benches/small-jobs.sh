#!/usr/bin/env bash
# How close a whole `resident embed` job comes to the bare actors' rate, for small jobs:
# the first N Wikipedia articles, embedded by the bare actors (`embed-bench`: the same local
# actors fed from memory, no files, no planning, model load not counted) and by the job
# (scan, pool start with model load, probes, planned chunks, shards, manifest, merge,
# report), one after the other in one run. Prints the CPU model and one table.
# Usage: benches/small-jobs.sh [--docs 1000,10000] [--before PATH] [--model DIR]
#   --before PATH   also runs this `resident` binary (e.g. built from an earlier commit)
set -euo pipefail
cd "$(dirname "$0")/.."
docs_list="1000,10000" before="" model=models/all-MiniLM-L6-v2
while [ $# -gt 0 ]; do
  case "$1" in
    --docs) docs_list=$2; shift 2 ;;
    --before) before=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    *) echo "unknown argument $1; use --docs 1000,10000, --before PATH, --model DIR" >&2; exit 2 ;;
  esac
done
scripts/fetch-model.sh >/dev/null
scripts/fetch-data.sh >/dev/null
cargo build --release -p resident-bench --bin embed-bench -p resident-cli --bin resident
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cores=$(nproc)
echo "CPU: $(lscpu | sed -n 's/^Model name: *//p'), $cores cores; $(date -u +%F); model $(basename "$model")"
echo
echo "| docs | run | wall s | docs/s | against bare | chunks |"
echo "|---:|---|---:|---:|---:|---|"
job_row() { # docs label binary input
  local out="$work/out-$RANDOM"
  RUST_LOG=warn "$3" embed --input "$4" --model "$model" --output "$out" >/dev/null 2>&1
  python3 - "$out/report.json" "$1" "$2" "$bare_rate" <<'EOF'
import json, sys
report = json.load(open(sys.argv[1]))
docs, label, bare = int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
wall = report["wall_seconds"]
rate = docs / wall
chunks = report["chunks"]
print(f"| {docs:,} | {label} | {wall:.1f} | {rate:.1f} | {rate / bare:.3f}x | {chunks['total']} (body {chunks['size']}) |")
EOF
  rm -rf "$out"
}
for docs in ${docs_list//,/ }; do
  input="$work/wiki-$docs.jsonl"
  head -n "$docs" data/wiki_vital.jsonl >"$input"
  # Bare: chunks of an eighth of the corpus per actor pair, so both actors stay busy.
  line=$(RUST_LOG=warn ./target/release/embed-bench --model "$model" --data "$input" \
    --chunk-size $(((docs + 4 * cores - 1) / (4 * cores))) | tail -1)
  bare_wall=$(echo "$line" | awk -F'|' '{gsub(/ /,"",$5); print $5}')
  bare_rate=$(echo "$line" | awk -F'|' '{gsub(/ /,"",$6); print $6}')
  echo "| $(python3 -c "print(f'{$docs:,}')") | bare actors (\`embed-bench\`) | $bare_wall | $bare_rate | 1.000x | $((4 * cores)) |"
  [ -n "$before" ] && job_row "$docs" "\`resident embed\`, before" "$before" "$input"
  job_row "$docs" "\`resident embed\`" ./target/release/resident "$input"
done
