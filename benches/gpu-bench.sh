#!/usr/bin/env bash
# Runs on the GPU machine (device tool), from the repo root, with .gpu-carry/ carried
# (scripts/pack-gpu-carry.sh): all-MiniLM-L6-v2 docs/s on the 10k Wikipedia articles,
# Resident f16 against sentence-transformers fp16 on the same GPU, then a Qwen3-0.6B-sized
# encoder with random weights (bf16) for tokens/s and model-FLOPs utilisation.
set -euo pipefail
work=/tmp/resident-gpu
mkdir -p "$work"
xz -dc .gpu-carry/embed-bench.xz > "$work/embed-bench" && chmod +x "$work/embed-bench"
xz -dc .gpu-carry/wiki_vital.jsonl.xz > "$work/wiki_vital.jsonl"
xz -dc .gpu-carry/qwen3-tokenizer.json.xz > "$work/qwen3-tokenizer.json"
site=$(python3 -c 'import site; print(site.getsitepackages()[0])')
export LD_LIBRARY_PATH="$site/nvidia/cu13/lib:${LD_LIBRARY_PATH:-}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
limit=${LIMIT:-0}
echo "| engine | device | docs | wall s | docs/s | tokens/s | padding | tokenise share | load s |"
echo "|---|---|---:|---:|---:|---:|---:|---:|---:|"
RUST_LOG=warn "$work/embed-bench" --model .gpu-carry/minilm-f16 --data "$work/wiki_vital.jsonl" \
  --limit "$limit" --replicas 1 --gpus 1 --dtype f16 --chunk-size 2048 --label "resident f16"
HF_HUB_OFFLINE=1 python3 benches/embed_st.py --model .gpu-carry/minilm-f16 \
  --data "$work/wiki_vital.jsonl" --limit "$limit" --device cuda --fp16 --batch-size 32 2>/dev/null
HF_HUB_OFFLINE=1 python3 benches/embed_st.py --model .gpu-carry/minilm-f16 \
  --data "$work/wiki_vital.jsonl" --limit "$limit" --device cuda --fp16 --batch-size 256 2>/dev/null
python3 benches/qwen3_random.py --tokenizer "$work/qwen3-tokenizer.json" --out "$work/qwen3-0.6b-random"
RUST_LOG=warn "$work/embed-bench" --model "$work/qwen3-0.6b-random" --data "$work/wiki_vital.jsonl" \
  --limit "$limit" --replicas 1 --gpus 1 --dtype bf16 --chunk-size 2048 --label "resident qwen3-0.6B random bf16"
echo "MFU: 2 x 0.44e9 non-embedding parameters x tokens/s (+ attention) / 989e12 (H100/H200 dense bf16)"
