#!/usr/bin/env bash
# What resident embed's options cost against the plain command on the same corpus: prompts,
# binary and int8 output, Parquet with a carried column, and windows. Each variant runs into
# a fresh output on a local cluster (the default actors), every variant once per round,
# ROUNDS rounds alternating; prints a table of wall seconds, docs/s and tokens/s (the
# report's figures). Needs a release build and the model (scripts/fetch-model.sh) and data
# (scripts/fetch-data.sh).
#
#   benches/embed-options.sh [short|long] [ROUNDS]
#
# short: the first 2,000 leads of data/wiki_vital.jsonl (most fit one window of 128).
# long: the first 400 articles of data/wiki_long.jsonl (about 600 tokens each: plain cuts
# them at MiniLM's 256 tokens, --split embeds all of them, so compare tokens/s there).
set -euo pipefail
cd "$(dirname "$0")/.."
corpus=${1:-short}
rounds=${2:-2}
bin=target/release/resident
model=models/all-MiniLM-L6-v2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
case $corpus in
  short) head -2000 data/wiki_vital.jsonl >"$work/in.jsonl" ;;
  long) head -400 data/wiki_long.jsonl >"$work/in.jsonl" ;;
  *) echo "usage: $0 [short|long] [ROUNDS]" >&2; exit 2 ;;
esac
# Each variant's flags, `|` between arguments (a prompt holds a space).
variants=(
  ""
  "--prompt|query: |--precision|binary"
  "--format|parquet|--keep-columns|title"
  "--precision|int8"
  "--split|tokens:128:16"
  "--split|tokens:128:16|--pool-windows|mean"
  "--split|sentences:128"
)
echo "corpus: $corpus ($(wc -l <"$work/in.jsonl") records), $rounds rounds; $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores"
printf '| %-45s | %-8s | %-10s | %-8s | %-9s | %-8s |\n' variant round wall_s docs/s tokens/s windows
for round in $(seq "$rounds"); do
  for i in "${!variants[@]}"; do
    IFS='|' read -r -a flags <<<"${variants[$i]}"
    out="$work/out-$round-$i"
    started=$(date +%s.%N)
    RESIDENT_LOG=warn "$bin" embed --input "$work/in.jsonl" --model "$model" --output "$out" \
      "${flags[@]}" >/dev/null 2>"$work/log" || { cat "$work/log"; exit 1; }
    ended=$(date +%s.%N)
    python3 - "$out/report.json" "$started" "$ended" "${variants[$i]:-plain}" "$round" <<'EOF'
import json, sys
report = json.load(open(sys.argv[1]))
wall = float(sys.argv[3]) - float(sys.argv[2])
windows = (report.get("windows") or {}).get("windows", "")
print(f"| {sys.argv[4]:<45} | {sys.argv[5]:<8} | {wall:<10.1f} | {report['docs_per_second']:<8.1f} | "
      f"{report['tokens'] / wall:<9.0f} | {windows!s:<8} |")
EOF
    rm -rf "$out"
  done
done
