#!/usr/bin/env bash
# Docs/s of Resident's embed actors against sentence-transformers on this machine's CPU, one
# after the other in one run: all-MiniLM-L6-v2 and all-mpnet-base-v2, on Wikipedia lead
# sections (about 100 tokens) and on long documents that fill each model's token limit
# (data/wiki_long.jsonl, scripts/make-long-docs.py). Prints the CPU model and one table.
# Usage: benches/compare-embed.sh [--limit N] [--models minilm,mpnet] [--data short,long]
#   --limit N   documents per row (default: 10,033 short and 1,811 long for MiniLM, 2,000
#               short and 500 long for MPNet, about 8x the work per token)
set -euo pipefail
cd "$(dirname "$0")/.."
limit="" models="minilm,mpnet" datasets="short,long"
while [ $# -gt 0 ]; do
  case "$1" in
    --limit) limit=$2; shift 2 ;;
    --models) models=$2; shift 2 ;;
    --data) datasets=$2; shift 2 ;;
    *) echo "unknown argument $1; use --limit N, --models minilm,mpnet, --data short,long" >&2; exit 2 ;;
  esac
done
scripts/fetch-model.sh >/dev/null
[[ $models == *mpnet* ]] && scripts/fetch-model.sh all-mpnet-base-v2 >/dev/null
scripts/fetch-data.sh >/dev/null
venv=${ST_VENV:-.venv-st}
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import sentence_transformers" 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q sentence-transformers==6.2.0 torch==2.15.0
fi
cargo build --release -p resident-bench --bin embed-bench
cores=$(nproc)
echo "CPU: $(lscpu | sed -n 's/^Model name: *//p'), $cores cores; $(date -u +%F)"
echo
echo "| engine | device | docs | wall s | docs/s | tokens/s | padding | tokenise share | load s |"
echo "|---|---|---:|---:|---:|---:|---:|---:|---:|"
for model in ${models//,/ }; do
  for data in ${datasets//,/ }; do
    case "$model:$data" in
      minilm:*) dir=models/all-MiniLM-L6-v2 name=MiniLM ;;&
      mpnet:*) dir=models/all-mpnet-base-v2 name=MPNet ;;&
      *:short) file=data/wiki_vital.jsonl ;;&
      *:long) file=data/wiki_long.jsonl ;;&
      minilm:short) n=${limit:-0} ;;
      minilm:long) n=${limit:-0} ;;
      mpnet:short) n=${limit:-2000} ;;
      mpnet:long) n=${limit:-500} ;;
      *) echo "unknown model or data: $model $data" >&2; exit 2 ;;
    esac
    RUST_LOG=warn ./target/release/embed-bench --model "$dir" --data "$file" --limit "$n" \
      --chunk-size 250 --label "Resident, $cores actors x 1 thread, $name, $data"
    HF_HUB_OFFLINE=1 "$venv/bin/python" benches/embed_st.py --model "$dir" --data "$file" \
      --limit "$n" --threads "$cores" 2>/dev/null | sed "s/| cpu f32 |/($name, $data) | cpu f32 |/"
  done
done
