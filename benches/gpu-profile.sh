#!/usr/bin/env bash
# Runs on the GPU machine (device tool), from the repo root, with $carry/ carried
# (scripts/pack-gpu-carry.sh; CARRY names another folder of the same files): where the GPU time of one embed-bench run goes, by kernel.
# Nsight Compute times every kernel launch (gpu__time_duration); benches/kernel_table.py
# sums them by kernel name and prints the top of the table. Writes the raw CSVs to $OUT.
# PROFILE_MODELS="mpnet qwen3" (the default; also "generate") picks the models; RUN_TESTS=0 skips the models' tests; LIMIT (default 128) the
# number of long documents profiled (every launch is replayed, so keep it small).
set -uo pipefail
work=/tmp/resident-gpu
carry=${CARRY:-.gpu-carry}
out=${OUT:-$work}
mkdir -p "$work" "$out"
xz -dc $carry/bins.tar.xz | tar -C "$work" -xf - && chmod +x "$work/embed-bench"
xz -dc $carry/wiki_vital.jsonl.xz > "$work/wiki_vital.jsonl"
xz -dc $carry/qwen3-tokenizer.json.xz > "$work/qwen3-tokenizer.json"
python3 scripts/make-long-docs.py "$work/wiki_vital.jsonl" "$work/wiki_long.jsonl"
site=$(python3 -c 'import site; print(site.getsitepackages()[0])')
export LD_LIBRARY_PATH="$site/nvidia/cu13/lib:${LD_LIBRARY_PATH:-}"
limit=${LIMIT:-128}
if [[ -f $work/models-tests && ${RUN_TESTS:-1} == 1 ]]; then
  # resident-models' unit tests built with CUDA (scripts/build-cuda.sh --tests): the fused
  # kernels against plain candle on the CPU.
  chmod +x "$work/models-tests"
  "$work/models-tests" --test-threads 1 2>&1 | grep -E -A3 '^test |test result|panicked' || echo "FAILED: models tests"
fi

profile() { # label, model dir, dtype, extra args...
  local label=$1 model=$2 dtype=$3; shift 3
  echo
  echo "### $label ($limit long documents, $dtype)"
  RUST_LOG=warn ncu --csv --print-units base --metrics gpu__time_duration.sum \
    --log-file "$out/$label.csv" "$work/embed-bench" --model "$model" \
    --data "$work/wiki_long.jsonl" --limit "$limit" --replicas 1 --gpus 1 --dtype "$dtype" \
    "$@" > "$work/$label.out" 2>&1 || { echo "FAILED: $label"; tail -5 "$work/$label.out"; }
  python3 benches/kernel_table.py "$out/$label.csv"
}

models=${PROFILE_MODELS:-mpnet qwen3}
if [[ $models == *mpnet* ]]; then
  python3 benches/mpnet_random.py --config-dir $carry/mpnet-config --out "$work/mpnet-random" >&2
  profile mpnet "$work/mpnet-random" f16 --chunk-size 2048
fi
if [[ $models == *qwen3* ]]; then
  python3 benches/qwen3_random.py --tokenizer "$work/qwen3-tokenizer.json" \
    --out "$work/qwen3-0.6b-random" >&2
  profile qwen3 "$work/qwen3-0.6b-random" bf16 --chunk-size 4096 --max-batch-size 4096
fi
if [[ $models == *generate* ]]; then
  # The kernels of about one decode-only step of the generation engine (issue 42): 64 short
  # prompts prefill in the first ~11 steps (~1,000 launches a step), so GENERATE_SKIP
  # launches in, the steps decode only. Their GPU time against the step's wall time (the
  # `generate-bench --profile` table) says how much of a step the GPU is busy.
  xz -dc $carry/bins.tar.xz | tar -C "$work" -xf - generate-bench && chmod +x "$work/generate-bench"
  [[ -d $work/smollm2-random ]] || python3 benches/generate_hf.py random \
    --config $carry/smollm2-hf --out "$work/smollm2-random" >&2
  echo
  echo "### generate: ${GENERATE_COUNT:-1100} launches after ${GENERATE_SKIP:-20000} (64 short prompts in flight, bf16)"
  RUST_LOG=warn ncu --csv --print-units base --metrics gpu__time_duration.sum \
    --launch-skip "${GENERATE_SKIP:-20000}" --launch-count "${GENERATE_COUNT:-1100}" \
    --log-file "$out/generate.csv" "$work/generate-bench" --model "$work/smollm2-random" \
    --data "$work/wiki_long.jsonl" --gpu 0 --dtype bf16 --prompts 64 --article-chars 200 \
    --max-new-tokens 32 --batches 64 > "$work/generate-profile.out" 2>&1 ||
    { echo "FAILED: generate profile"; tail -5 "$work/generate-profile.out"; }
  python3 benches/kernel_table.py "$out/generate.csv" --top 25
fi
