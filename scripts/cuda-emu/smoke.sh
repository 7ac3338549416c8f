#!/usr/bin/env bash
# The binaries' GPU paths on cuda-emu's emulated GPU, on small inputs (scripts/cuda-emu.sh
# smoke builds them first): what benches/gpu-bench.sh will run on a real GPU, so that a
# mistake there shows here first. Prints `ok:` or `FAILED (status):` a step, and exits 1 if
# any failed. Speeds printed here are the emulator's, not a GPU's.
# Needs scripts/fetch-model.sh (MiniLM), scripts/fetch-model.sh smollm2-135m-instruct,
# scripts/fetch-qwen3-tokenizer.sh and scripts/fetch-data.sh.
set -uo pipefail
cd "$(dirname "$0")/../.."
bins=$PWD/target/cuda/emu-dist
work=${WORK:-/tmp/cuda-emu-smoke}
rm -rf "$work" && mkdir -p "$work"
export LD_LIBRARY_PATH="$PWD/target/cuda-emu/lib:${LD_LIBRARY_PATH:-}"
export RUST_LOG=${RUST_LOG:-warn}
failed=0

step() { # label, command...
  local label=$1
  shift
  echo "== $label" >&2
  if "$@"; then
    echo "ok: $label" >&2
  else
    echo "FAILED ($?): $label" >&2
    failed=1
  fi
}

said() { # label, file, pattern: the file holds the pattern
  step "$1" grep -q -- "$3" "$2"
}

gguf=models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf
minilm=models/all-MiniLM-L6-v2
# Eight short documents: the emulator runs a 135M model at a few GFLOP/s.
python3 - "$work/docs.jsonl" <<'PY'
import json, sys
texts = [line for line in open("data/wiki_vital.jsonl", encoding="utf-8")][:8]
with open(sys.argv[1], "w", encoding="utf-8") as out:
    for n, line in enumerate(texts):
        record = json.loads(line)
        out.write(json.dumps({"id": f"doc-{n}", "text": record["text"][:300]}) + "\n")
PY

# Generation: the dense GPU path from the GGUF in bf16, graphs on and off, greedy and
# sampled on the device, greedy listing logprobs there, with the step profile.
step "generate-bench on the GPU (bf16, graphs on and off, plain and sampled, profiled)" \
  "$bins/generate-bench" --model "$gguf" --data "$work/docs.jsonl" --gpu 0 --dtype bf16 \
  --prompts 2 --article-chars 200 --max-new-tokens 6 --batches 2 --cuda-graphs on,off \
  --decoding plain,sampled,logprobs --profile
# gpu-bench's comparison of the paged attention's kernels (auto above is tensor cores).
step "generate-bench on the GPU, attention on tensor cores and on the scalar kernel" \
  "$bins/generate-bench" --model "$gguf" --data "$work/docs.jsonl" --gpu 0 --dtype bf16 \
  --prompts 2 --article-chars 200 --max-new-tokens 4 --batches 2 --attention tensor-cores,scalar
# (`--dtype quantised` on the GPU is left out: candle's quantised matmuls live in its static
# MoE/GGUF library, which the emulator cannot run; README.md.)
# The agreement check (issue 42) reads a safetensors checkpoint: the GGUF exported.
step "export SmolLM2 as a safetensors checkpoint" "$bins/generate-bench" --model "$gguf" \
  --export-hf "$work/smollm2-hf" --export-weights
step "generate-bench --agreement (GPU f32 and bf16 against the CPU dense path)" \
  "$bins/generate-bench" --model "$work/smollm2-hf" --data "$work/docs.jsonl" --gpu 0 \
  --agreement 2 --article-chars 200 --max-new-tokens 8
# The job with no device flag: the GPU by default (issue 43), said in the summary, and the
# GPU actor's own step limits (256 sequences, 4,096 rows a step), logged at info.
step "resident generate, no device flag" bash -c "RUST_LOG=warn,resident_node_agent::backends::generate=info \
  '$bins/resident' generate --input '$work/docs.jsonl' --model '$gguf' \
  --output '$work/generated' --max-new-tokens 6 --prompt 'Summarise: {text}' \
  2> '$work/generate.log'"
said "resident generate chose the GPU" "$work/generate.log" "GPU"
said "the GPU actor took the GPU's step limits" "$work/generate.log" \
  'max_sequences=256 max_step_tokens=4096 device="GPU"'
step "generations written" test -s "$work/generated/generations.jsonl"

# Evaluation on the GPU (benches/gpu-session.sh runs these benches there): four questions'
# choices scored with each question's prompt computed once (the paged cache's prefix
# sharing), then a `resident eval` suite of those choices and of answers judged by two
# filters with two few-shot examples, its tasks on one pool. The suite's choices must be the
# lone job's, score for score.
python3 benches/make_choice_set.py data/wiki_vital.jsonl 4 30 > "$work/choices.jsonl"
mkdir -p "$work/answers"
python3 benches/make_answer_set.py data/wiki_vital.jsonl 4 3 "$work/answers"
step "resident generate --score with choices on the GPU" bash -c "'$bins/resident' generate \
  --input '$work/choices.jsonl' --model '$gguf' --output '$work/scored' --score \
  --max-new-tokens 0 --template none 2> '$work/score.log'"
said "the scoring job chose the GPU" "$work/score.log" "GPU"
step "every choice scored on the GPU" python3 scripts/cuda-emu/gpu-checks.py scored \
  "$work/scored" 4
python3 - "$work" <<'PY'
import json, sys
work = sys.argv[1]
tasks = [
    ("choices", ["--input", f"{work}/choices.jsonl", "--score", "--max-new-tokens", "0"]),
    ("answers", ["--input", f"{work}/answers/test.jsonl", "--max-new-tokens", "6",
                 "--stop", "\n", "--prompt", "Text: {text}\nQuestion: What is this text about?\nAnswer:",
                 "--reference-field", "answer", "--ignore-case", "--filter", "whole=",
                 "--filter", "word=([A-Za-z]+)", "--fewshot-input", f"{work}/answers/dev.jsonl",
                 "--fewshot", "2", "--target-delimiter", " "]),
]
lines = ['flags = ["--template", "none"]', ""]
for name, flags in tasks:
    lines += ["[[task]]", f'name = "{name}"', f"flags = {json.dumps(flags)}", ""]
open(f"{work}/suite.toml", "w").write("\n".join(lines))
PY
step "resident eval: choices and answers on the GPU" bash -c "'$bins/resident' eval \
  --tasks '$work/suite.toml' --model '$gguf' --output '$work/eval' > '$work/eval.table' \
  2> '$work/eval.log'"
step "the suite's tasks ran on one pool, each with its figures" python3 \
  scripts/cuda-emu/gpu-checks.py suite "$work/eval/results.json" choices,answers
said "the suite's table names both filters" "$work/eval.table" "exact_match,word"
step "the suite's choices are the lone job's" python3 scripts/cuda-emu/gpu-checks.py same \
  "$work/scored/generations.jsonl" "$work/eval/choices/generations.jsonl"

# Issue 42's 0.5B-class shapes (gpu-bench.sh's large-decoder): random weights made on the
# GPU, then one short prompt through each (bias in Qwen2.5's projections, Qwen3's q/k norms).
for shape in qwen2.5-0.5b qwen3-0.6b; do
  step "$shape random weights on the GPU" "$bins/generate-bench" --random-checkpoint "$shape" \
    --tokenizer models/qwen3-tokenizer/tokenizer.json --out "$work/$shape" --gpu 0
  step "generate-bench, $shape (bf16)" "$bins/generate-bench" --model "$work/$shape" \
    --data "$work/docs.jsonl" --gpu 0 --dtype bf16 --prompts 1 --article-chars 60 \
    --max-new-tokens 2 --ignore-eos --batches 1
  rm -rf "${work:?}/$shape"
done

# Embedding: MiniLM in f16 on the GPU, flash and materialised attention; the job with no flag.
for attention in flash materialised; do
  step "embed-bench on the GPU (f16, $attention attention)" "$bins/embed-bench" \
    --model "$minilm" --data "$work/docs.jsonl" --limit 8 --replicas 1 --gpus 1 --dtype f16 \
    --chunk-size 8 --attention "$attention" --label "cuda-emu, $attention"
done
step "resident embed, no device flag" bash -c "'$bins/resident' embed --input \
  '$work/docs.jsonl' --model '$minilm' --output '$work/embedded' 2> '$work/embed.log'"
said "resident embed chose the GPU" "$work/embed.log" "GPU"
step "embeddings written" test -s "$work/embedded/embeddings.npy"

# Two GPUs, an 8-GPU server's path at its smallest (one agent, an actor on each GPU): with no
# flag, one actor per GPU, both given chunks, and what one GPU writes, vector for vector and
# token for token (the emulator sums each row alike whatever its batch).
export CUDA_EMU_DEVICES=2
step "resident embed on two GPUs" bash -c "'$bins/resident' embed --input '$work/docs.jsonl' \
  --model '$minilm' --output '$work/embedded-2' --chunk-size 2 2> '$work/embed-2.log'"
said "resident embed put an actor on each GPU" "$work/embed-2.log" \
  "one actor per GPU (2 GPUs on 1 node)"
step "both GPUs embedded" python3 scripts/cuda-emu/gpu-checks.py used \
  "$work/embedded-2/report.json" 0,1
step "two GPUs' vectors are one GPU's" cmp "$work/embedded/embeddings.npy" \
  "$work/embedded-2/embeddings.npy"
step "resident embed on two GPUs, half a GPU an actor" bash -c "'$bins/resident' embed \
  --input '$work/docs.jsonl' --model '$minilm' --output '$work/embedded-halves' \
  --gpus-per-actor 0.5 --chunk-size 2 2> '$work/embed-halves.log'"
said "four actors at half a GPU" "$work/embed-halves.log" "4 model loads"
step "both GPUs embedded, at half a GPU an actor" python3 scripts/cuda-emu/gpu-checks.py used \
  "$work/embedded-halves/report.json" 0,1
step "half GPUs' vectors are one GPU's" cmp "$work/embedded/embeddings.npy" \
  "$work/embedded-halves/embeddings.npy"
step "resident generate on two GPUs" bash -c "'$bins/resident' generate --input \
  '$work/docs.jsonl' --model '$gguf' --output '$work/generated-2' --max-new-tokens 6 \
  --prompt 'Summarise: {text}' --chunk-size 4 2> '$work/generate-2.log'"
said "resident generate put an actor on each GPU" "$work/generate-2.log" \
  "one actor per GPU (2 GPUs on 1 node)"
step "both GPUs generated" python3 scripts/cuda-emu/gpu-checks.py used \
  "$work/generated-2/report.json" 0,1
step "two GPUs' generations are one GPU's" python3 scripts/cuda-emu/gpu-checks.py same \
  "$work/generated/generations.jsonl" "$work/generated-2/generations.jsonl"
# GPU 0 refuses its context (another process holds it in exclusive mode, or it fell off the
# bus): the job runs on GPU 1 and says why GPU 0 was left out.
step "resident embed with GPU 0 unavailable" bash -c "CUDA_EMU_UNAVAILABLE_DEVICES=0 \
  '$bins/resident' embed --input '$work/docs.jsonl' --model '$minilm' \
  --output '$work/embedded-gpu1' 2> '$work/embed-gpu1.log'"
said "the job says GPU 0 was left out" "$work/embed-gpu1.log" "a GPU cannot be opened"
step "GPU 1 alone embedded" python3 scripts/cuda-emu/gpu-checks.py used \
  "$work/embedded-gpu1/report.json" 1
step "GPU 1's vectors are GPU 0's" cmp "$work/embedded/embeddings.npy" \
  "$work/embedded-gpu1/embeddings.npy"
# resident embed on the two GPUs, one chunk a document, with a fault planned by `settings`
# (environment assignments): it must end with the vectors of one GPU, none lost. Its output
# goes to $work/embedded-NAME, its log to $work/embed-NAME.log.
embed_through_fault() { # label, name, settings
  local label=$1 name=$2 settings=$3
  step "resident embed, $label" bash -c "$settings timeout 300 '$bins/resident' embed \
    --input '$work/docs.jsonl' --model '$minilm' --output '$work/embedded-$name' \
    --chunk-size 1 2> '$work/embed-$name.log'"
  step "$label: no vector lost" cmp "$work/embedded/embeddings.npy" \
    "$work/embedded-$name/embeddings.npy"
}
# GPU 1's context fails for good partway through the job (as after an Xid fault: cuda-emu
# fails every later call on it): the agent takes GPU 1 out of service, its chunks go to GPU 0.
for launch in 50 150 300; do
  embed_through_fault "GPU 1 failing at its launch $launch" "fault-$launch" \
    "CUDA_EMU_FAULT_AFTER_LAUNCHES=1:$launch"
  said "the agent took GPU 1 out of service ($launch)" "$work/embed-fault-$launch.log" \
    "GPU failed: taken out of service"
done
# GPU 1's driver reports an uncorrectable ECC error (Xid 48) mid-job while its work still
# succeeds: the agent's NVML watcher (cuda-emu's libnvidia-ml) takes GPU 1 out of service at
# once and its actor stops.
embed_through_fault "GPU 1 reporting Xid 48 at its launch 150" xid "CUDA_EMU_XID_AT_LAUNCH=1:48:150"
said "the agent took GPU 1 out of service (Xid 48)" "$work/embed-xid.log" \
  "NVML reported Xid 48 (a double-bit ECC error)"
# GPU 1 falls off the bus mid-job: its context fails and NVML answers GPU_IS_LOST for it.
# The agent takes it out of service, and the NVML watcher, whose wait failed, goes on
# watching GPU 0 alone.
embed_through_fault "GPU 1 falling off the bus at its launch 150" lost \
  "CUDA_EMU_GPU_LOST_AT_LAUNCH=1:150 RESIDENT_LOG=info"
said "the agent took GPU 1 out of service (lost)" "$work/embed-lost.log" \
  "GPU failed: taken out of service"
said "the NVML watcher goes on with GPU 0" "$work/embed-lost.log" \
  "watching GPUs for critical Xid and ECC errors gpus=\[0\]"
# The same mid-run for generation's continuous batch (its run ends with the model's error).
step "resident generate, GPU 1 failing at its launch 1500" bash -c "CUDA_EMU_FAULT_AFTER_LAUNCHES=1:1500 \
  timeout 600 '$bins/resident' generate --input '$work/docs.jsonl' --model '$gguf' \
  --output '$work/generated-fault' --max-new-tokens 6 --prompt 'Summarise: {text}' \
  --chunk-size 1 2> '$work/generate-fault.log'"
said "the agent took GPU 1 out of service (generate)" "$work/generate-fault.log" \
  "GPU failed: taken out of service"
step "GPU 1's failure lost no generation" python3 scripts/cuda-emu/gpu-checks.py same \
  "$work/generated/generations.jsonl" "$work/generated-fault/generations.jsonl"
unset CUDA_EMU_DEVICES

# A T4 (compute capability 7.5): auto is f16, bf16 is refused with what to use.
export CUDA_EMU_ARCH=75
step "generate-bench on an emulated T4 (auto: f16)" "$bins/generate-bench" --model "$gguf" \
  --data "$work/docs.jsonl" --gpu 0 --prompts 2 --article-chars 200 --max-new-tokens 4 \
  --batches 2
step "embed-bench on an emulated T4 (f16)" "$bins/embed-bench" --model "$minilm" \
  --data "$work/docs.jsonl" --limit 8 --replicas 1 --gpus 1 --dtype f16 --chunk-size 8 \
  --label "cuda-emu T4"
step "bf16 on an emulated T4 is refused" bash -c \
  "! '$bins/generate-bench' --model '$gguf' --data '$work/docs.jsonl' --gpu 0 --dtype bf16 \
     --prompts 1 --max-new-tokens 2 --batches 1 > '$work/t4-bf16.log' 2>&1"
said "the refusal names f16" "$work/t4-bf16.log" "use dtype f16"
unset CUDA_EMU_ARCH

if ((failed)); then
  echo "cuda-emu smoke: some steps FAILED (above)" >&2
  exit 1
fi
echo "cuda-emu smoke: every step passed" >&2
