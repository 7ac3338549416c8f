#!/usr/bin/env bash
# Docs/s of all-MiniLM-L6-v2 on the Wikipedia vital articles: Resident's embed actors and
# sentence-transformers on the same machine, one after the other.
# Usage: benches/compare-embed.sh [--limit N]   (default: all 10,033 articles)
set -euo pipefail
cd "$(dirname "$0")/.."
limit=0
if [ "${1:-}" = "--limit" ]; then limit=$2; fi
scripts/fetch-model.sh >/dev/null
scripts/fetch-data.sh >/dev/null
venv=${ST_VENV:-.venv-st}
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import sentence_transformers" 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q sentence-transformers==6.2.0 torch==2.15.0
fi
cargo build --release -p resident-bench --bin embed-bench
cores=$(nproc)
echo "| engine | device | docs | wall s | docs/s | tokens/s | padding | tokenise share | load s |"
echo "|---|---|---:|---:|---:|---:|---:|---:|---:|"
RUST_LOG=warn ./target/release/embed-bench --limit "$limit" --chunk-size 500
HF_HUB_OFFLINE=1 "$venv/bin/python" benches/embed_st.py --limit "$limit" --threads "$cores" 2>/dev/null
RUST_LOG=warn ./target/release/embed-bench --limit "$limit" --chunk-size 500 --replicas 1 --threads "$cores" \
  --label "resident: 1 actor x $cores threads (for comparison)"
