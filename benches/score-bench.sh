#!/usr/bin/env bash
# Scoring a corpus (perplexity filtering): `resident generate --score --max-new-tokens 0
# --template none` over the first N Wikipedia leads against llama.cpp (llama-cpp-python,
# the same GGUF, the same threads, logits of every row) scoring the same texts the same
# way. Prints a table: scored tokens per second and the corpus perplexity each engine finds.
# Needs: target/release/resident, scripts/fetch-model.sh smollm2-135m-instruct,
# scripts/fetch-data.sh, and for the llama.cpp row a venv with llama-cpp-python 0.3.36
# (scripts/make-llama-cpp-fixture.py says how; LLAMA_PY= its python, default
# target/llama-venv/bin/python; the row is left out where it is missing).
# A generation actor uses every core of its node, so THREADS (llama.cpp's) is nproc by default.
# Usage: TEXTS=1000 THREADS=2 OUT=/tmp/score-bench [RESIDENT=path] benches/score-bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."
texts=${TEXTS:-1000}
threads=${THREADS:-$(nproc)}
out=${OUT:-/tmp/score-bench}
model=models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf
llama_py=${LLAMA_PY:-target/llama-venv/bin/python}
rm -rf "$out" && mkdir -p "$out"
head -n "$texts" data/wiki_vital.jsonl > "$out/input.jsonl"
"${RESIDENT:-target/release/resident}" generate --input "$out/input.jsonl" --model "$model" \
  --output "$out/resident" --score --max-new-tokens 0 --template none > "$out/resident.log" 2>&1
if [[ -x "$llama_py" ]]; then
  "$llama_py" benches/score_llama_cpp.py "$model" "$out/input.jsonl" "$threads" > "$out/llama.json"
fi
python3 - "$out" "$threads" <<'PY'
import json, os, sys
out, threads = sys.argv[1], sys.argv[2]
report = json.load(open(f"{out}/resident/report.json"))
rows = [("resident generate --score (whole job: start, load, score, write)", report["scored_texts"],
         report["scored_tokens"], report["wall_seconds"], report["scored_perplexity"])]
if os.path.exists(f"{out}/llama.json"):
    llama = json.load(open(f"{out}/llama.json"))
    rows.append(("llama.cpp, llama-cpp-python: eval and log-softmax (loading excluded)",
                 llama["texts"], llama["tokens"], llama["seconds"], llama["perplexity"]))
    rows.append(("llama.cpp's eval alone (its forward passes, logits to the host)",
                 llama["texts"], llama["tokens"], llama["eval_seconds"], llama["perplexity"]))
print(f"| engine ({threads} threads) | texts | tokens scored | s | tokens/s | corpus perplexity |")
print("|---|---:|---:|---:|---:|---:|")
for name, texts, tokens, seconds, perplexity in rows:
    print(f"| {name} | {texts} | {tokens} | {seconds:.1f} | {tokens / seconds:,.0f} | {perplexity:.3f} |")
PY
