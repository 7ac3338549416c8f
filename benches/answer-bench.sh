#!/usr/bin/env bash
# Generated answers checked against references (`resident generate --reference-field`):
# RECORDS open-book questions from Wikipedia leads (benches/make_answer_set.py: an
# article's first sentence, "what is this text about?", the title as the reference), answered
# with no examples and with SHOTS examples from a dev split (`--fewshot-input`, the examples
# answered by their reference after `--target-delimiter ' '`, as lm-evaluation-harness
# writes them). Each generation is judged by two named filters (`--filter`): `whole`, the
# whole answer, and `clause`, its first clause without a leading "The text is about (the)"
# (a flexible match, as GSM8K's flexible-extract beside its strict-match). Prints a table:
# wall seconds of the whole job, prompt and generated tokens, and each filter's exact match
# (case and punctuation ignored). Every record shares the examples, so
# the engines compute them once (the prefix cache).
# Needs: target/release/resident, scripts/fetch-model.sh smollm2-135m-instruct,
# scripts/fetch-data.sh. FLAGS= adds flags to both runs (`--dtype f32`: the dense engine).
# Usage: RECORDS=400 SHOTS=5 OUT=/tmp/answer-bench [RESIDENT=path] [FLAGS=...] benches/answer-bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."
records=${RECORDS:-400}
shots=${SHOTS:-5}
out=${OUT:-/tmp/answer-bench}
model=models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf
rm -rf "$out" && mkdir -p "$out"
python3 benches/make_answer_set.py data/wiki_vital.jsonl 50 "$records" "$out"
run() { # name, extra flags...
  local name=$1
  shift
  "${RESIDENT:-target/release/resident}" generate --input "$out/test.jsonl" --model "$model" \
    --output "$out/$name" --template none --max-new-tokens 16 --stop $'\n' \
    --prompt $'Text: {text}\nQuestion: What is this text about?\nAnswer:' \
    --reference-field answer --ignore-case --ignore-punctuation ${FLAGS:-} "$@" \
    --filter 'whole=' --filter 'clause=^\s*(?:The (?:text|article) is about )?(?:the )?([^.,;:(]+)' \
    > "$out/$name.log" 2>&1
}
run zero-shot
run few-shot --fewshot-input "$out/dev.jsonl" --fewshot "$shots" --target-delimiter ' '
python3 - "$out" "$shots" <<'PY'
import json, os, sys
out, shots = sys.argv[1], sys.argv[2]
flags = os.environ.get("FLAGS", "")
print(f"| run {flags} | records | s (whole job) | prompt tokens | generated tokens "
      "| exact match: whole | exact match: first clause |")
print("|---|---:|---:|---:|---:|---:|---:|")
for name, label in (("zero-shot", "no examples"), ("few-shot", f"{shots} examples (shared start)")):
    r = json.load(open(f"{out}/{name}/report.json"))
    print(f"| {label} | {r['reference_records']} | {r['wall_seconds']:.1f} | {r['prompt_tokens']:,} "
          f"| {r['generated_tokens']:,} | {r['filters']['whole']['exact_match']:.3f} "
          f"| {r['filters']['clause']['exact_match']:.3f} |")
PY
