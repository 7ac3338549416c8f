#!/usr/bin/env bash
# Scoring documents longer than the window: `resident generate --score` on long documents
# (LEADS consecutive Wikipedia leads joined into one, DOCS of them) in one full-context
# window, then under a WINDOW-token context in rolling windows (the default stride: each
# token once, lm-evaluation-harness's loglikelihood_rolling), with shorter strides (Hugging
# Face's strided perplexity), and on the head alone (--max-score-windows 1). Prints a table:
# tokens scored, tokens computed, seconds, scored tokens per second, and the corpus
# perplexity beside the full-context one (what the windows cost in context).
# Needs: target/release/resident, scripts/fetch-model.sh smollm2-135m-instruct,
# scripts/fetch-data.sh.
# Usage: DOCS=8 LEADS=24 WINDOW=1024 OUT=/tmp/score-windows [RESIDENT=path] benches/score-windows-bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."
docs=${DOCS:-8}
leads=${LEADS:-24}
window=${WINDOW:-1024}
out=${OUT:-/tmp/score-windows}
model=models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf
rm -rf "$out" && mkdir -p "$out"
python3 - data/wiki_vital.jsonl "$docs" "$leads" > "$out/input.jsonl" <<'PY'
import json, sys
path, docs, leads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
texts = [json.loads(line)["text"] for line in open(path)][: docs * leads]
for d in range(docs):
    print(json.dumps({"id": d, "text": "\n\n".join(texts[d * leads:(d + 1) * leads])}))
PY
run() { # name, flags...
  local name=$1
  shift
  "${RESIDENT:-target/release/resident}" generate --input "$out/input.jsonl" --model "$model" \
    --output "$out/$name" --score --max-new-tokens 0 --template none "$@" > "$out/$name.log" 2>&1
}
half=$((window / 2))
quarter=$((window / 4))
run full --max-score-windows 1
run rolling --max-context "$window"
run "stride-$half" --max-context "$window" --score-stride "$half"
run "stride-$quarter" --max-context "$window" --score-stride "$quarter"
run head --max-context "$window" --max-score-windows 1
python3 - "$out" "$window" "$half" "$quarter" <<'PY'
import json, sys
out, window, half, quarter = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
runs = [
    ("full", "8192 (the model's), one window"),
    ("rolling", f"{window}, rolling (default stride, {window - 2})"),
    (f"stride-{half}", f"{window}, --score-stride {half}"),
    (f"stride-{quarter}", f"{window}, --score-stride {quarter}"),
    ("head", f"{window}, --max-score-windows 1 (head alone)"),
]
full = json.load(open(f"{out}/full/report.json"))
assert full["truncated_prompts"] == 0, "a document is longer than the model's context: lower LEADS"
print("| window | texts | tokens scored | tokens computed | s | scored tokens/s | perplexity | vs full context |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
for name, label in runs:
    r = json.load(open(f"{out}/{name}/report.json"))
    ppl = r["scored_perplexity"]
    print(f"| {label} | {r['scored_texts']} | {r['scored_tokens']:,} | {r['prompt_tokens']:,} | "
          f"{r['wall_seconds']:.1f} | {r['scored_tokens'] / r['wall_seconds']:,.0f} | {ppl:.3f} | "
          f"{(ppl / full['scored_perplexity'] - 1) * 100:+.1f}% |")
PY
