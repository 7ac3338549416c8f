#!/usr/bin/env bash
# A lent GPU's runs, prepared (the device tool: `run`, carry [".gpu-carry"], timeout_s 580):
# benches/gpu-bench.sh's sections in the order that matters most, each under its own time
# limit so that one slow section cannot take the rest, the whole log kept in
# $OUT/gpu-bench.log (the tool's reply holds only the output's last 12,000 characters).
# Build the carry first, here: RESIDENT_CUDA_ARCHS=90 scripts/build-cuda.sh --tests &&
# scripts/pack-gpu-carry.sh.
#
#   bash benches/gpu-session.sh first    kernels against their CPU references (105 s), then
#                                        generation and its agreement check (285 s), then
#                                        `resident generate` end to end at a GPU actor's
#                                        defaults (60 s), then Qwen3 embedding (120 s):
#                                        issues 42 and 43's headlines. A lent machine's
#                                        start and this call use most of the 15 minutes,
#                                        so the second call may not run, or only in part.
#   bash benches/gpu-session.sh second   the 0.5B-class decoders (200 s), the defaults and
#                                        the first load (150 s), the embedding rows (200 s)
#   bash benches/gpu-session.sh third    the product through real processes (TLS scheduler,
#                                        CUDA agent, its NVML fault watcher; 240 s), then the
#                                        out-of-memory rows (150 s), then what listing
#                                        logprobs on the device costs (90 s)
#
# GENERATE_BATCHES (64,256), AGREEMENT_PROMPTS (16) and QWEN3_TORCH (0: transformers' Qwen3
# rows left out, their figure known) default smaller than gpu-bench.sh's, to fit one call.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/gpu-session}
mkdir -p "$out"
export GENERATE_BATCHES=${GENERATE_BATCHES:-64,256} AGREEMENT_PROMPTS=${AGREEMENT_PROMPTS:-16}
export QWEN3_TORCH=${QWEN3_TORCH:-0} PYTHONUNBUFFERED=1

section() { # seconds, sections: gpu-bench.sh's sections under a time limit, logged
  local seconds=$1 began=$SECONDS
  shift
  echo "== sections: $* (at most $seconds s)" | tee -a "$out/gpu-bench.log"
  timeout "$seconds" env SECTIONS="$*" bash benches/gpu-bench.sh 2>&1 | tee -a "$out/gpu-bench.log"
  local status=${PIPESTATUS[0]}
  ((status == 124)) && echo "TIMED OUT after $seconds s: $*" | tee -a "$out/gpu-bench.log"
  echo "== $* took $((SECONDS - began)) s" | tee -a "$out/gpu-bench.log"
}

case ${1:-first} in
  first)
    section 105 kernels
    section 285 generate agreement
    DEFAULTS_JOBS=generate section 60 defaults
    section 120 qwen3
    ;;
  second)
    section 200 large-decoder
    section 150 defaults load
    EMBED_MATERIALISED=0 section 200 embed
    ;;
  third)
    section 240 cluster
    section 150 oom
    section 90 logprobs
    ;;
  *)
    echo "unknown plan '$1'; use first, second or third" >&2
    exit 2
    ;;
esac
