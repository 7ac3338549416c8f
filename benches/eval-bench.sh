#!/usr/bin/env bash
# `resident eval` against the same tasks run as separate `resident generate` jobs: two
# tasks over RECORDS open-book questions from Wikipedia leads (benches/make_answer_set.py),
# one with no examples and one with SHOTS (`--fewshot-input`), each judged by the whole
# answer. The separate jobs each start a cluster and load the model; the suite connects
# once and runs both tasks on one pool. Prints a table: wall seconds of each way (whole
# processes), model loads, and each task's exact match (equal both ways).
# Needs: target/release/resident, scripts/fetch-model.sh smollm2-135m-instruct,
# scripts/fetch-data.sh. Usage: RECORDS=400 SHOTS=5 OUT=/tmp/eval-bench [RESIDENT=path] benches/eval-bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."
records=${RECORDS:-400}
shots=${SHOTS:-5}
out=${OUT:-/tmp/eval-bench}
resident=${RESIDENT:-target/release/resident}
model=models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf
rm -rf "$out" && mkdir -p "$out"
python3 benches/make_answer_set.py data/wiki_vital.jsonl 50 "$records" "$out"
common=(--template none --max-new-tokens 16 --stop $'\n'
  --prompt $'Text: {text}\nQuestion: What is this text about?\nAnswer:'
  --reference-field answer --ignore-case --ignore-punctuation)
fewshot=(--fewshot-input "$out/dev.jsonl" --fewshot "$shots" --target-delimiter ' ')
start=$(date +%s.%N)
"$resident" generate --input "$out/test.jsonl" --model "$model" --output "$out/alone/zero-shot" \
  "${common[@]}" > "$out/alone-zero.log" 2>&1
"$resident" generate --input "$out/test.jsonl" --model "$model" --output "$out/alone/few-shot" \
  "${common[@]}" "${fewshot[@]}" > "$out/alone-few.log" 2>&1
alone=$(python3 -c "print($(date +%s.%N) - $start)")
python3 - "$out" "${common[@]}" -- "${fewshot[@]}" <<'PY'
import json, sys
out = sys.argv[1]
split = sys.argv.index("--")
common, fewshot = sys.argv[2:split], sys.argv[split + 1:]
test = f"{out}/test.jsonl"
lines = [f"flags = {json.dumps(common)}", ""]
for name, extra in (("zero-shot", []), ("few-shot", fewshot)):
    lines += ["[[task]]", f'name = "{name}"', f"flags = {json.dumps(['--input', test] + extra)}", ""]
open(f"{out}/suite.toml", "w").write("\n".join(lines))
PY
start=$(date +%s.%N)
"$resident" eval --tasks "$out/suite.toml" --model "$model" --output "$out/suite" \
  > "$out/suite.table" 2> "$out/suite.log"
suite=$(python3 -c "print($(date +%s.%N) - $start)")
python3 - "$out" "$alone" "$suite" <<'PY'
import json, sys
out, alone, suite = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
def job(path):
    return json.load(open(f"{path}/report.json"))
names = ("zero-shot", "few-shot")
alone_reports = [job(f"{out}/alone/{n}") for n in names]
suite_reports = [job(f"{out}/suite/{n}") for n in names]
results = json.load(open(f"{out}/suite/results.json"))
pools = {t["pool"] for t in results["tasks"]}
print("| run | s (whole processes) | pools | exact match: no examples | exact match: examples |")
print("|---|---:|---:|---:|---:|")
for label, seconds, reports, npools in (("2 x resident generate", alone, alone_reports, 2),
                                         ("resident eval, 2 tasks", suite, suite_reports, len(pools))):
    em = [f"{r['exact_match']:.3f}" for r in reports]
    print(f"| {label} | {seconds:.1f} | {npools} | {em[0]} | {em[1]} |")
same = all(open(f"{out}/alone/{n}/generations.jsonl").read() == open(f"{out}/suite/{n}/generations.jsonl").read() for n in names)
print(f"\ngenerations.jsonl equal both ways: {same}")
PY
