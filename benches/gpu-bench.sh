#!/usr/bin/env bash
# Runs on the GPU machine (device tool), from the repo root, with .gpu-carry/ carried
# (scripts/pack-gpu-carry.sh). Prints markdown tables:
#  1. first load: MiniLM loaded on a fresh CUDA JIT cache and again on the warm one (our
#     kernels and candle's, patched in vendor/, ship as SASS: the two should be equal);
#  1b. defaults: `resident embed` and `resident generate` with no device flag (the GPU, one
#     actor per GPU, said in the summary line) and with --gpus-per-actor 0;
#  2. all-MiniLM-L6-v2 (its shape with random weights: the real ones no longer fit in the carry) on the 10k Wikipedia articles and on long documents
#     (scripts/make-long-docs.py: past both models' token limits): Resident f16 against
#     sentence-transformers fp16 on the same GPU, plus the f16 vectors' cosine parity;
#  3. the same for an all-mpnet-base-v2-shaped model with random weights (the real 438 MB
#     cannot travel; both engines load the same random file, so speed and parity are real);
#  4. a Qwen3-0.6B-sized encoder with random weights (bf16): tokens/s and model-FLOPs use
#     (flash attention, and once with the scores materialised, for the kernel's gain),
#     and our users' reference job (250,010 items x 512 tokens on 16 A6000s) estimated from
#     this GPU by bf16 peak (benches/reference_job.py);
#  5. the cluster (benches/gpu-cluster.sh): `resident embed` through a real scheduler and a
#     CUDA agent process (TLS, tokens) against the bare actor, four actors sharing one GPU at
#     0.25 each, and the NVML series on /metrics;
#  0. generation (issue 31): generate-bench against transformers' generate, bf16, batch 64,
#     on SmolLM2-135M's shape with random weights; decode-bound rows with CUDA graphs on and off;
#     the news job with the paged attention on tensor cores and on the scalar kernel;
#  0a. large-decoder: issue 42's 0.5B-class rows (Qwen2.5-0.5B's and Qwen3-0.6B's shapes,
#     random weights made by generate-bench --random-checkpoint), 256 in flight;
#  6. OOM backoff: another process holds all but OOM_FREE_GIB of the GPU, and Resident runs
#     with a token budget far past what fits; it must halve the budget and finish.
# Every step runs even when one before it fails; failures print as FAILED lines.
#  0b. agreement: the GPU path in f32 and bf16 against the CPU dense path (issue 42);
#  0c. kernels: resident-models' tests built with CUDA, when carried (build-cuda.sh --tests):
#     every kernel (encoders' fused ops, KV scatter, argmax, paged attention and its first-use
#     check, rope_heads, the sampled draw, decode graphs against eager steps) against its CPU
#     reference.
# GENERATE_BATCHES and GENERATE_STEP_TOKENS (default 512,4096) set the generate rows;
# SECTIONS="generate logprobs large-decoder agreement kernels load defaults embed qwen3 cluster oom" (the default) picks sections, LARGE_DECODERS="qwen2.5-0.5b qwen3-0.6b" the 0.5B-class shapes, EMBED_MODELS="minilm mpnet" models, EMBED_MATERIALISED=0 drops the materialised-attention rows; QWEN3_BUDGETS="16384 65536" runs
# the Qwen3 rows at several token budgets (default 16384), with the GEMM ceiling first;
# QWEN3_TORCH=0 leaves transformers' Qwen3 rows out, QWEN3_COMPARE=0 runs the reference job alone.
set -uo pipefail
work=/tmp/resident-gpu
mkdir -p "$work"
# The binaries, and resident-models' CUDA tests when they were built (section `kernels`).
xz -dc .gpu-carry/bins.tar.xz | tar -C "$work" -xf - && chmod +x "$work/embed-bench" "$work/resident" "$work/generate-bench"
# The carried MiniLM's weights travel xz'd; unpacked beside its config, in the carry folder
# (ignored by git), so every path below stays as it was.
if [[ -f .gpu-carry/minilm-f16/model.safetensors.xz ]]; then
  xz -dc .gpu-carry/minilm-f16/model.safetensors.xz > .gpu-carry/minilm-f16/model.safetensors
elif [[ ! -f .gpu-carry/minilm-f16/model.safetensors ]]; then
  # Carried without its weights (the binaries with candle's SASS for five GPUs left no room
  # under the 64 MiB limit): random weights of its shape, f16, which both engines load.
  python3 - .gpu-carry/minilm-f16 <<'PY'
import sys, torch
from safetensors.torch import save_file
from transformers import BertConfig, BertModel
torch.manual_seed(0)
model = BertModel(BertConfig.from_pretrained(sys.argv[1]), add_pooling_layer=False).eval()
save_file({k: v.half().contiguous() if v.is_floating_point() else v.contiguous()
           for k, v in model.state_dict().items()}, f"{sys.argv[1]}/model.safetensors")
print("MiniLM shape with random weights (f16)", file=sys.stderr)
PY
fi
xz -dc .gpu-carry/wiki_vital.jsonl.xz > "$work/wiki_vital.jsonl"
xz -dc .gpu-carry/qwen3-tokenizer.json.xz > "$work/qwen3-tokenizer.json"
python3 scripts/make-long-docs.py "$work/wiki_vital.jsonl" "$work/wiki_long.jsonl"
site=$(python3 -c 'import site; print(site.getsitepackages()[0])')
export LD_LIBRARY_PATH="$site/nvidia/cu13/lib:${LD_LIBRARY_PATH:-}"
export HF_HUB_OFFLINE=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
limit=${LIMIT:-0}

step() { # label, command...: runs it, prints FAILED with the exit code when it fails
  local label=$1; shift
  "$@" || echo "FAILED ($?): $label"
}

compare() { # model dir, dim, label, data
  local model=$1 dim=$2 label=$3 data=$4 tag
  tag=$(basename "$model")-$(basename "$data" .jsonl)
  step "resident $label" env RUST_LOG=warn "$work/embed-bench" --model "$model" --data "$data" \
    --limit "$limit" --replicas 1 --gpus 1 --dtype f16 --chunk-size 2048 \
    --label "resident f16, $label" --vectors-out "$work/$tag.resident.f32"
  # The same with the attention scores materialised (EMBED_MATERIALISED=0 leaves it out):
  # the flash kernel's gain, or loss on short documents, in this run.
  [[ ${EMBED_MATERIALISED:-1} == 0 ]] || step "resident $label, materialised" env RUST_LOG=warn \
    "$work/embed-bench" --model "$model" --data "$data" --limit "$limit" --replicas 1 --gpus 1 \
    --dtype f16 --chunk-size 2048 --attention materialised \
    --label "resident f16, $label, materialised attention"
  for batch in 32 256; do
    step "sentence-transformers $label batch $batch" python3 benches/embed_st.py \
      --model "$model" --data "$data" --limit "$limit" --device cuda --fp16 \
      --batch-size "$batch" --vectors-out "$work/$tag.st$batch.f32" 2>/dev/null
  done
  step "parity $label" python3 benches/compare_vectors.py "$work/$tag.resident.f32" \
    "$work/$tag.st32.f32" --dim "$dim" --label "$label, resident f16 vs sentence-transformers fp16" \
    --min-cosine 0.99 >> "$work/parity.txt"
}

sections=${SECTIONS:-generate logprobs large-decoder agreement kernels load defaults embed qwen3 cluster oom}
if [[ $sections == *generate* ]]; then
  # SmolLM2-135M's shape with random weights (the real GGUF cannot travel): the exported
  # config and tokenizer (generate-bench --export-hf), weights made by transformers, loaded
  # by both engines. The same prompts (news-length articles in the chat turn), greedy.
  step "smollm2 random weights" python3 benches/generate_hf.py random --config .gpu-carry/smollm2-hf \
    --out "$work/smollm2-random" >&2
  echo
  # Rows a step: 512 (the actor's default) and 4096 (fewer, larger prefill steps: the
  # GPU's tensor cores idle at 512 rows of a 135M model; which default a GPU gets waits on
  # this row).
  echo "SmolLM2-135M shape, random weights, bf16, 256 prompts, up to 128 new tokens"
  step "resident generate-bench" env RUST_LOG=warn "$work/generate-bench" --model "$work/smollm2-random" \
    --data "$work/wiki_long.jsonl" --gpu 0 --dtype bf16 --prompts 256 --max-new-tokens 128 \
    --batches ${GENERATE_BATCHES:-1,16,64,128} --step-tokens ${GENERATE_STEP_TOKENS:-512,4096}
  echo
  echo "| engine | prompts | prompt tokens | generated tokens | wall s | generated tokens/s |"
  echo "|---|---:|---:|---:|---:|---:|"
  # GENERATE_REFERENCE=0 leaves transformers out (a rerun on the same GPU, its figure known).
  [[ ${GENERATE_REFERENCE:-1} == 0 ]] ||
    step "transformers generate" python3 benches/generate_hf.py time --model "$work/smollm2-random" \
      --data "$work/wiki_long.jsonl" --prompts 256 --batch 64 --max-new-tokens 128 2>/dev/null
  # Where a step's time goes (issue 42), decode-only steps apart: the news job at the largest
  # batch, and the decode-bound job (short prompts). The profiled runs synchronise the GPU at
  # every phase boundary, so their tokens/s sit a little below the timed rows above.
  echo
  step "resident generate-bench --profile, news" env RUST_LOG=warn "$work/generate-bench" \
    --model "$work/smollm2-random" --data "$work/wiki_long.jsonl" --gpu 0 --dtype bf16 \
    --prompts 256 --max-new-tokens 128 --batches "${PROFILE_BATCHES:-256}" --profile
  echo
  echo "Decode-bound: 256 short prompts (200 characters of article), 128 new tokens"
  step "resident generate-bench --profile, decode-bound" env RUST_LOG=warn "$work/generate-bench" \
    --model "$work/smollm2-random" --data "$work/wiki_long.jsonl" --gpu 0 --dtype bf16 \
    --prompts 256 --article-chars 200 --max-new-tokens 128 --batches 64,256 --profile
  # Sampled rows (temperature, top-k, top-p) drawn on the device (issue 42 item 5) against
  # greedy at the same 256 in flight, each with decode steps replayed as CUDA graphs (item 6,
  # the default) and run eagerly: the graphs' gain in one run.
  echo
  echo "Decode-bound, 256 in flight: greedy against sampled (temperature 0.8, top-k 50, top-p 0.95), CUDA graphs on and off"
  step "resident generate-bench, sampled" env RUST_LOG=warn "$work/generate-bench" \
    --model "$work/smollm2-random" --data "$work/wiki_long.jsonl" --gpu 0 --dtype bf16 \
    --prompts 256 --article-chars 200 --max-new-tokens 128 --batches 256 --decoding plain,sampled \
    --cuda-graphs on,off
  # The paged attention's two kernels on the news job (prefill-heavy, ~600 keys a decode
  # row): tensor cores (the default for bf16) against the scalar one, in one run.
  echo
  echo "News job, 256 in flight, 4096 rows a step: attention on tensor cores against the scalar kernel"
  step "resident generate-bench, attention kernels" env RUST_LOG=warn "$work/generate-bench" \
    --model "$work/smollm2-random" --data "$work/wiki_long.jsonl" --gpu 0 --dtype bf16 \
    --prompts 256 --max-new-tokens 128 --batches 256 --step-tokens 4096 \
    --attention tensor-cores,scalar
fi
if [[ $sections == *logprobs* ]]; then
  # Greedy rows that list their logprobs (top 5) take them where the logits are
  # (listed_rows): against plain greedy in the same run, what `--logprobs` costs.
  echo
  echo "Decode-bound, 256 in flight: greedy against greedy listing each token's logprobs with the 5 likeliest"
  step "resident generate-bench, logprobs" env RUST_LOG=warn "$work/generate-bench" \
    --model "$work/smollm2-random" --data "$work/wiki_long.jsonl" --gpu 0 --dtype bf16 \
    --prompts 256 --article-chars 200 --max-new-tokens 128 --batches 256 \
    --decoding plain,logprobs
fi
if [[ $sections == *large-decoder* ]]; then
  # Issue 42's 0.5B-class goal: at least 15,000 generated tokens/s at 256 in flight (vLLM
  # publishes 17,711 for Qwen2.5-0.5B and 8,588 for Qwen3-0.6B on one A800). The real
  # shapes with random weights (bf16, made on this GPU), the Qwen tokenizer, every sequence
  # to its 128 tokens (vLLM's ignore_eos): decode-bound (short prompts), then news length.
  for shape in ${LARGE_DECODERS:-qwen2.5-0.5b qwen3-0.6b}; do
    step "$shape random weights" "$work/generate-bench" --random-checkpoint "$shape" \
      --tokenizer "$work/qwen3-tokenizer.json" --out "$work/$shape-random" --gpu 0
    echo
    echo "$shape shape, random weights, bf16, 256 prompts, 128 new tokens each (ignore_eos); decode-bound, then news length"
    for chars in 200 2600; do
      step "resident generate-bench, $shape, articles of $chars characters" env RUST_LOG=warn \
        "$work/generate-bench" --model "$work/$shape-random" --data "$work/wiki_long.jsonl" \
        --gpu 0 --dtype bf16 --prompts 256 --article-chars "$chars" --max-new-tokens 128 \
        --ignore-eos --batches 256 --step-tokens "$( ((chars > 200)) && echo 512,4096 || echo 512)"
    done
    rm -rf "$work/$shape-random"
  done
fi
if [[ $sections == *agreement* ]]; then
  # Correct, not just fast (issue 42): on the same random weights of SmolLM2's shape, the
  # GPU in f32 against the CPU dense path in f32 (greedy tokens) and bf16 against f32 (logits).
  [[ -d $work/smollm2-random ]] || step "smollm2 random weights" python3 benches/generate_hf.py \
    random --config .gpu-carry/smollm2-hf --out "$work/smollm2-random" >&2
  echo
  step "generate agreement" env RUST_LOG=warn "$work/generate-bench" --model "$work/smollm2-random" \
    --data "$work/wiki_long.jsonl" --gpu 0 --prompts "${AGREEMENT_PROMPTS:-64}" --batches 64 \
    --agreement "${AGREEMENT_PROMPTS:-64}"
fi
if [[ $sections == *kernels* && -f $work/models-tests ]]; then
  # resident-models' unit tests built with CUDA (scripts/build-cuda.sh --tests): every
  # kernel against its CPU reference, on this GPU.
  echo
  chmod +x "$work/models-tests"
  "$work/models-tests" cuda device_ops step_profile paged_attention attention_check flash_attention rope_heads generate::draw:: decode_graph --test-threads 1 2>&1 | grep -E -A3 '^test |test result|panicked' ||
    echo "FAILED: models tests"
fi
if [[ $sections == *load* ]]; then
  # The driver keeps what it compiles from PTX in CUDA_CACHE_PATH: an empty one is a fresh
  # machine (with SASS for this GPU inside the binary, nothing is compiled). 64 documents,
  # so the load dominates.
  echo
  echo "| first load (MiniLM f16, 64 documents) | CUDA JIT cache | load s | wall s |"
  echo "|---|---|---:|---:|"
  for cache in fresh warm; do
    [[ $cache == fresh ]] && rm -rf "$work/jit-cache"
    CUDA_CACHE_PATH="$work/jit-cache" RUST_LOG=warn "$work/embed-bench" --model .gpu-carry/minilm-f16 \
      --data "$work/wiki_vital.jsonl" --limit 64 --replicas 1 --gpus 1 --dtype f16 --chunk-size 64 \
      --label "first load, $cache cache" > "$work/load-$cache.txt" 2>&1 || echo "FAILED: first load, $cache cache"
    python3 - "$work/load-$cache.txt" "$cache" <<'PY'
import sys
cache = sys.argv[2]
for line in open(sys.argv[1]):
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    if len(cells) >= 9 and cells[0].startswith("first load"):
        print(f"| embed-bench | {cache} | {cells[8]} | {cells[3]} |")
PY
  done
fi
if [[ $sections == *defaults* ]]; then
  # Issue 43: `resident embed` and `resident generate` with no device flag use the GPU (one
  # actor per GPU) and say so in their summary line; `--gpus-per-actor 0` keeps the CPU.
  # The generate row is the engine end to end (issue 42), on SmolLM2's shape with random
  # weights (made by the generate section, or here), `--dtype auto` (bf16 from 8.0), at a
  # GPU actor's defaults (256 sequences in flight, 4,096 rows a step): the generate
  # section's news row at 256 and 4096 is the engine alone on the same work.
  [[ -d $work/smollm2-random ]] || step "smollm2 random weights" python3 benches/generate_hf.py \
    random --config .gpu-carry/smollm2-hf --out "$work/smollm2-random" >&2
  # The engine's news work exactly: the first 256 articles cut to 2,600 characters (as
  # generate-bench's --article-chars), in the same words of prompt, so both count the same
  # prompt tokens.
  python3 -c 'import itertools, json, sys
for line in itertools.islice(open(sys.argv[1]), 256):
    r = json.loads(line)
    print(json.dumps({"id": r.get("id"), "text": r["text"][:2600]}))' "$work/wiki_long.jsonl" > "$work/news256.jsonl"
  echo
  # "after ready": the report's figure over the wall time less `ready_seconds` (input scan,
  # model pin, loads), which is what the engine's rows measure.
  echo "| job, no device flag unless named | summary line (stderr) | wall s | ready s | docs/s | generated tokens/s | after ready |"
  echo "|---|---|---:|---:|---:|---:|---:|"
  run_default() { # label, job, output dir, args...
    local label=$1 job=$2 out=$3
    shift 3
    rm -rf "$out"
    RUST_LOG=${DEFAULTS_LOG:-warn} "$work/resident" "$job" --output "$out" "$@" > "$out.json" 2> "$out.err" ||
      echo "FAILED ($?): $label"
    python3 - "$label" "$out.json" "$out.err" "$job" <<'PY'
import json, sys
label, report, err, job = sys.argv[1:]
summary = next((l.strip() for l in open(err) if l.startswith(f"resident {job} of")), "(none)")
try:
    r = json.load(open(report))
    tokens = r.get("generated_tokens_per_second")
    wall, ready = r["wall_seconds"], r.get("ready_seconds", 0.0)
    after = r.get("generated_tokens", 0) / max(wall - ready, 1e-9)
    tokens = '' if tokens is None else f"{tokens:,.0f} | {after:,.0f}"
    print(f"| {label} | {summary.split(': ', 1)[-1]} | {wall:.1f} | {ready:.1f} | {r['docs_per_second']:,.0f} | {tokens or ' | '} |")
except Exception as e:
    print(f"| {label} | {summary} | FAILED: {e} | | | | |")
PY
    grep -m4 -i "weights on\|step limits\|error" "$out.err" | cut -c1-300
  }
  # DEFAULTS_JOBS picks the rows (default "embed cpu generate"; gpu-session.sh's first call
  # runs "generate" alone, issue 42's end-to-end row).
  jobs=${DEFAULTS_JOBS:-embed cpu generate}
  [[ $jobs != *embed* ]] ||
    run_default "resident embed, MiniLM f16, 10k Wikipedia leads" embed "$work/defaults-embed-gpu" \
      --input "$work/wiki_vital.jsonl" --model .gpu-carry/minilm-f16
  [[ $jobs != *cpu* ]] ||
    run_default "resident embed --gpus-per-actor 0" embed "$work/defaults-embed-cpu" \
      --input "$work/wiki_vital.jsonl" --model .gpu-carry/minilm-f16 --gpus-per-actor 0
  [[ $jobs != *generate* ]] || DEFAULTS_LOG=info run_default "resident generate, SmolLM2 shape, 256 news prompts, 128 new tokens" \
    generate "$work/defaults-generate" --input "$work/news256.jsonl" --model "$work/smollm2-random" \
    --prompt $'Summarise this article in three sentences.\n\n{text}' --max-new-tokens 128
fi
echo
echo "| engine | device | docs | wall s | docs/s | tokens/s | padding | tokenise share | load s |"
echo "|---|---|---:|---:|---:|---:|---:|---:|---:|"
: > "$work/parity.txt"
embed_models=${EMBED_MODELS:-minilm mpnet}
if [[ $sections == *embed* && $embed_models == *minilm* ]]; then
compare .gpu-carry/minilm-f16 384 "MiniLM, Wikipedia leads" "$work/wiki_vital.jsonl"
compare .gpu-carry/minilm-f16 384 "MiniLM, long documents" "$work/wiki_long.jsonl"
fi
if [[ $sections == *embed* && $embed_models == *mpnet* ]]; then
step "mpnet random weights" python3 benches/mpnet_random.py --config-dir .gpu-carry/mpnet-config \
  --out "$work/mpnet-random" >&2
compare "$work/mpnet-random" 768 "MPNet random weights, Wikipedia leads" "$work/wiki_vital.jsonl"
compare "$work/mpnet-random" 768 "MPNet random weights, long documents" "$work/wiki_long.jsonl"
fi
if [[ $sections == *qwen3* ]]; then
step "qwen3 random weights" python3 benches/qwen3_random.py \
  --tokenizer "$work/qwen3-tokenizer.json" --out "$work/qwen3-0.6b-random" >&2
# QWEN3_COMPARE=0 runs the reference job alone (no rows against transformers, no GEMM shapes).
[[ ${QWEN3_COMPARE:-1} == 0 ]] && QWEN3_BUDGETS=
for budget in ${QWEN3_BUDGETS-16384}; do
  for data in wiki_vital wiki_long; do
    step "resident qwen3 $data" env RUST_LOG=warn "$work/embed-bench" --model "$work/qwen3-0.6b-random" \
      --data "$work/$data.jsonl" --limit "$limit" --replicas 1 --gpus 1 --dtype bf16 \
      --chunk-size 4096 --max-batch-tokens "$budget" --max-batch-size 4096 \
      --label "resident bf16, Qwen3-0.6B random weights, $data, budget $budget"
    # QWEN3_TORCH=0 leaves transformers out (a rerun on the same GPU, its figures known).
    [[ ${QWEN3_TORCH:-1} == 0 ]] || step "torch qwen3 $data" python3 benches/qwen3_torch.py --model "$work/qwen3-0.6b-random" \
      --data "$work/$data.jsonl" --limit "$limit" --max-batch-tokens "$budget" \
      --label "transformers Qwen3Model bf16 SDPA, $data, budget $budget" 2>/dev/null
  done
done
# The same on long documents with the materialised attention (scores in memory), for the
# flash kernel's gain in this run.
[[ ${QWEN3_COMPARE:-1} == 0 ]] || step "resident qwen3 materialised" env RUST_LOG=warn \
  "$work/embed-bench" --model "$work/qwen3-0.6b-random" --data "$work/wiki_long.jsonl" \
  --limit "$limit" --replicas 1 --gpus 1 --dtype bf16 --chunk-size 4096 --max-batch-tokens 16384 \
  --max-batch-size 4096 --attention materialised \
  --label "resident bf16, Qwen3-0.6B random weights, wiki_long, budget 16384, materialised attention"
echo
[[ ${QWEN3_COMPARE:-1} == 0 ]] || step "qwen3 GEMM shapes" python3 benches/qwen3_shapes.py
# Our users' reference job (issue 43): Wikipedia articles cut at 512 tokens, estimated for
# 16 A6000s from this GPU by bf16 peak (benches/reference_job.py).
reference_row=$(step "resident qwen3 reference job" env RUST_LOG=warn "$work/embed-bench" \
  --model "$work/qwen3-0.6b-random" --data "$work/wiki_long.jsonl" --limit "$limit" \
  --replicas 1 --gpus 1 --dtype bf16 --chunk-size 4096 --max-batch-tokens 65536 \
  --max-batch-size 4096 --max-seq-length 512 \
  --label "resident bf16, Qwen3-0.6B random weights, Wikipedia articles cut at 512 tokens")
echo "$reference_row"
echo "$reference_row" | python3 benches/reference_job.py \
  --gpu "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" ||
  echo "FAILED: reference job estimate"
fi
echo
cat "$work/parity.txt"
echo "MFU: 2 x 0.44e9 non-embedding parameters x tokens/s (+ attention) / 989e12 (H100/H200 dense bf16)"

if [[ $sections == *cluster* ]]; then
  echo
  step "cluster" benches/gpu-cluster.sh "$work" "$work/resident" "$work/embed-bench"
fi

[[ $sections == *oom* ]] || exit 0
# OOM backoff: hold all but OOM_FREE_GIB GiB, ask for a 4M-token budget on the long documents
# (the actor declares 0.5 GiB so that placement lets it start).
free_gib=${OOM_FREE_GIB:-1.5}
python3 - "$free_gib" > "$work/holder.log" 2>&1 <<'PY' &
import sys, time, torch
free, _ = torch.cuda.mem_get_info()
keep = int(float(sys.argv[1]) * 2**30)
hold = torch.empty(max(free - keep, 0), dtype=torch.uint8, device="cuda")
print(f"holding {hold.numel() / 2**30:.1f} GiB, leaving {keep / 2**30:.1f} GiB", flush=True)
time.sleep(600)
PY
holder=$!
sleep 15
cat "$work/holder.log"
echo
echo "OOM backoff: token budget 4,000,000 with ${free_gib} GiB of the GPU free"
RUST_LOG=warn "$work/embed-bench" --model .gpu-carry/minilm-f16 --data "$work/wiki_long.jsonl" \
  --limit 0 --replicas 1 --gpus 1 --vram-gib 0.5 --dtype f16 --chunk-size 1811 --max-batch-tokens 4000000 \
  --max-batch-size 100000 --label "resident f16, OOM backoff" > "$work/oom.out" 2> "$work/oom.err"
echo "exit code $?"
cat "$work/oom.out"
echo "halvings logged: $(grep -c 'halving the token budget' "$work/oom.err")"
grep -m5 -i 'memory\|error\|budget' "$work/oom.err" | cut -c1-300
kill "$holder" 2>/dev/null
wait 2>/dev/null
