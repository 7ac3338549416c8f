#!/usr/bin/env bash
# Packs what a GPU benchmark run needs into .gpu-carry/ (git-excluded), under the device
# tool's 64 MiB carry limit: the CUDA builds of embed-bench, generate-bench and resident (one
# xz stream), all-MiniLM-L6-v2's and all-mpnet-base-v2's config and tokenizer without their
# weights (too large to travel beside the binaries; gpu-bench.sh makes random ones of each
# shape, which both engines load),
# the Wikipedia articles (xz) and the Qwen3 tokenizer (xz). benches/gpu-bench.sh unpacks and
# runs them on the GPU machine; .gpu-profile/ (below) is for benches/gpu-profile.sh.
# Needs: scripts/build-cuda.sh done, target/release/generate-bench built, models and data fetched.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .git/info && { grep -qx '/.gpu-carry/' .git/info/exclude 2>/dev/null || echo '/.gpu-carry/' >> .git/info/exclude; }
out=.gpu-carry
rm -rf "$out" && mkdir -p "$out/minilm-f16/1_Pooling" "$out/mpnet-config/1_Pooling"
# The binaries in one xz stream whose dictionary spans them: most of their bytes are
# candle's kernels, the same in each, so each after the first costs little. With
# resident-models' tests built with CUDA (scripts/build-cuda.sh --tests: the kernels against
# their CPU references, gpu-bench.sh's section `kernels`), 33 MB this way against 51 MB as
# two streams (session 53, with candle's quantised library for sm_90). Single-threaded,
# since threads would split the stream and lose the sharing.
bins=(resident embed-bench generate-bench)
[[ -f target/cuda/dist/models-tests ]] && bins+=(models-tests)
# A binary that links candle's MoE stub (RESIDENT_CANDLE_MOE=stub, for cuda-emu) would abort
# at its first quantised matmul on the GPU: refused here, before GPU minutes find it.
for bin in "${bins[@]}"; do
  if grep -q 'is not in this build (RESIDENT_CANDLE_MOE=stub)' "target/cuda/dist/$bin"; then
    echo "target/cuda/dist/$bin links candle's MoE stub: rebuild without RESIDENT_CANDLE_MOE" \
      "(RESIDENT_CUDA_ARCHS=90 scripts/build-cuda.sh --tests)" >&2
    exit 1
  fi
done
tar -C target/cuda/dist -cf - "${bins[@]}" |
  xz -T1 --lzma2=preset=6,dict=192MiB > "$out/bins.tar.xz"
xz -T0 -6 -c data/wiki_vital.jsonl > "$out/wiki_vital.jsonl.xz"
# SmolLM2-135M-Instruct's config and tokenizer as a Hugging Face directory, without weights
# (gpu-bench.sh fills it with random ones of that shape): the CPU build's generate-bench.
target/release/generate-bench --model models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf \
  --export-hf "$out/smollm2-hf" >/dev/null
[[ -f models/qwen3-tokenizer/tokenizer.json ]] || scripts/fetch-qwen3-tokenizer.sh >&2
xz -T0 -6 -c models/qwen3-tokenizer/tokenizer.json > "$out/qwen3-tokenizer.json.xz"
mpnet=models/all-mpnet-base-v2
for f in config.json tokenizer.json tokenizer_config.json special_tokens_map.json vocab.txt \
  modules.json sentence_bert_config.json config_sentence_transformers.json 1_Pooling/config.json; do
  cp "$mpnet/$f" "$out/mpnet-config/$f"
done
src=models/all-MiniLM-L6-v2
for f in config.json tokenizer.json modules.json sentence_bert_config.json 1_Pooling/config.json; do
  cp "$src/$f" "$out/minilm-f16/$f"
done
# MiniLM's weights stay behind: with candle's kernels as SASS for five GPUs the binaries are
# 23 MB of xz, and its f16 weights (40 MB of xz) no longer fit beside them under 64 MiB.
# benches/gpu-bench.sh makes random weights of its shape on the GPU machine instead.
du -sh "$out"; du -sh "$out"/*
total=$(du -sb "$out" | cut -f1)
if ((total > 62 * 1024 * 1024)); then
  echo "warning: $out is $((total / 1024 / 1024)) MiB; with the working tree it must stay under the 64 MiB carry limit" >&2
fi
# .gpu-profile/: what benches/gpu-profile.sh needs (CARRY=.gpu-profile): the same binaries
# (resident-models' CUDA tests among them when built), without MiniLM's files.
profile=.gpu-profile
grep -qx "/$profile/" .git/info/exclude || echo "/$profile/" >> .git/info/exclude
rm -rf "$profile" && mkdir -p "$profile"
for f in bins.tar.xz wiki_vital.jsonl.xz qwen3-tokenizer.json.xz; do ln "$out/$f" "$profile/$f"; done
cp -r "$out/mpnet-config" "$profile/"
du -sh "$profile"
