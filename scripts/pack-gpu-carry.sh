#!/usr/bin/env bash
# Packs what a GPU benchmark run needs into .gpu-carry/ (git-excluded), under the device
# tool's 64 MiB carry limit: the CUDA build of embed-bench (xz), all-MiniLM-L6-v2 in f16
# (half the bytes; GPU actors run f16 anyway), the Wikipedia articles (xz) and the Qwen3
# tokenizer (xz). benches/gpu-bench.sh unpacks and runs them on the GPU machine.
# Needs: scripts/build-cuda.sh done, models and data fetched, .venv-st (torch) for the f16 copy.
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.gpu-carry/' .git/info/exclude 2>/dev/null || echo '/.gpu-carry/' >> .git/info/exclude
out=.gpu-carry
rm -rf "$out" && mkdir -p "$out/minilm-f16/1_Pooling"
xz -T0 -6 -c target/cuda/dist/embed-bench > "$out/embed-bench.xz"
xz -T0 -6 -c data/wiki_vital.jsonl > "$out/wiki_vital.jsonl.xz"
xz -T0 -6 -c models/qwen3-tokenizer/tokenizer.json > "$out/qwen3-tokenizer.json.xz"
src=models/all-MiniLM-L6-v2
for f in config.json tokenizer.json modules.json sentence_bert_config.json 1_Pooling/config.json; do
  cp "$src/$f" "$out/minilm-f16/$f"
done
"${ST_VENV:-.venv-st}/bin/python" - "$src/model.safetensors" "$out/minilm-f16/model.safetensors" <<'PY'
import sys
from safetensors.torch import load_file, save_file
tensors = {k: v.half() if v.is_floating_point() else v for k, v in load_file(sys.argv[1]).items()}
save_file(tensors, sys.argv[2])
PY
du -sh "$out"; du -sh "$out"/*
