#!/usr/bin/env bash
# What one decode step asks of the GPU, counted on cuda-emu (CUDA_EMU_STATS, stats.h): the
# host's launches, copies, waits and allocations, and the kernels the device runs.
# generate-bench runs twice on the emulated GPU, SHORT and LONG new tokens a sequence
# (--ignore-eos) with all else equal, with CUDA graphs on and then off; the difference of
# the counts over the LONG - SHORT decode steps between is a steady-state step's.
# On a GPU these are what a small model's step costs beyond its arithmetic: each host launch
# some microseconds, each wait a drained pipeline, each allocation a trip to the allocator.
# Needs `scripts/cuda-emu.sh build` (the binaries in target/cuda/emu-dist/), the SmolLM2
# GGUF (scripts/fetch-model.sh smollm2-135m-instruct) and data/wiki_vital.jsonl.
#
#   scripts/cuda-emu/step-profile.sh [generate-bench option...]   e.g. --decoding sampled
#
# SEQUENCES (4) in flight, SHORT (4) and LONG (8) new tokens, DTYPE (bf16; f16 for an
# emulated T4, CUDA_EMU_ARCH=75). Counts, not speeds: the emulator's times mean nothing.
set -euo pipefail
cd "$(dirname "$0")/../.."
bins=$PWD/target/cuda/emu-dist
work=${WORK:-/tmp/cuda-emu-step-profile}
sequences=${SEQUENCES:-4} short=${SHORT:-4} long=${LONG:-8} dtype=${DTYPE:-bf16}
((long > short)) || { echo "LONG ($long) must exceed SHORT ($short)" >&2; exit 2; }
# The first decode step captures the graph and the second replays it and checks it against
# an eager step: both must come before the steps counted.
((short >= 3)) || { echo "SHORT ($short) must be 3 or more: the capture and the checked first replay come before the steps counted" >&2; exit 2; }
rm -rf "$work" && mkdir -p "$work"
export LD_LIBRARY_PATH="$PWD/target/cuda-emu/lib:${LD_LIBRARY_PATH:-}" RUST_LOG=${RUST_LOG:-warn}
python3 - "$work/docs.jsonl" <<'PY'
import json, sys
lines = open("data/wiki_vital.jsonl", encoding="utf-8").readlines()[:8]
with open(sys.argv[1], "w", encoding="utf-8") as out:
    for n, line in enumerate(lines):
        out.write(json.dumps({"id": f"doc-{n}", "text": json.loads(line)["text"][:300]}) + "\n")
PY
for graphs in on off; do
  for tokens in "$short" "$long"; do
    echo "== graphs $graphs, $tokens new tokens" >&2
    CUDA_EMU_STATS="$work/$graphs-$tokens.json" "$bins/generate-bench" \
      --model models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf \
      --data "$work/docs.jsonl" --gpu 0 --dtype "$dtype" --prompts "$sequences" \
      --batches "$sequences" --article-chars 200 --ignore-eos --max-new-tokens "$tokens" \
      --cuda-graphs "$graphs" "$@" > "$work/$graphs-$tokens.log"
  done
done
python3 - "$work" "$short" "$long" "$sequences" "$dtype" <<'PY'
import json, sys
work, short, long, sequences, dtype = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
steps = long - short

def per_step(graphs):
    a = json.load(open(f"{work}/{graphs}-{short}.json"))
    b = json.load(open(f"{work}/{graphs}-{long}.json"))
    flat = lambda s: {**{k: v for k, v in s.items() if isinstance(v, int)},
                      **{f"ran {k}": v for k, v in s["kernels_ran"].items()}}
    fa, fb = flat(a), flat(b)
    return {k: (fb.get(k, 0) - fa.get(k, 0)) / steps for k in set(fa) | set(fb)}

on, off = per_step("on"), per_step("off")
rows = [
    ("kernels launched by the host", "kernel_launches"),
    ("cuBLAS calls by the host", "library_calls"),
    ("graph launches", "graph_launches"),
    ("operations replayed from graphs", "replayed"),
    ("copies to the device", "copies_to_device"),
    ("bytes to the device", "bytes_to_device"),
    ("copies to the host", "copies_to_host"),
    ("bytes to the host", "bytes_to_host"),
    ("copies on the device", "copies_on_device"),
    ("memsets", "memsets"),
    ("host waits for the device", "waits"),
    ("allocations", "allocations"),
    ("bytes allocated", "allocated_bytes"),
    ("frees", "frees"),
    ("allocations that took memory from the OS (pool growths)", "pool_growths"),
    ("CUDA events created", "events_created"),
]
print(f"\nOne decode step of SmolLM2-135M, {sequences} sequences, {dtype} (cuda-emu counts: "
      f"runs of {short} and {long} new tokens, difference / {steps})\n")
print("| per decode step | CUDA graphs on | CUDA graphs off |\n|---|---:|---:|")
for label, key in rows:
    print(f"| {label} | {on.get(key, 0):g} | {off.get(key, 0):g} |")
ran = sorted((k for k in set(on) | set(off) if k.startswith("ran ") and (on.get(k) or off.get(k))),
             key=lambda k: -off.get(k, 0))
print("\n| kernels the device runs a step | CUDA graphs on | CUDA graphs off |\n|---|---:|---:|")
for k in ran:
    print(f"| {k[4:]} | {on.get(k, 0):g} | {off.get(k, 0):g} |")
print(f"| all kernels | {sum(on.get(k, 0) for k in ran):g} | {sum(off.get(k, 0) for k in ran):g} |")
PY
