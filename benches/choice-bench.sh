#!/usr/bin/env bash
# Multiple-choice evaluation: `resident generate --score` over RECORDS questions made from
# Wikipedia leads (benches/make_choice_set.py: an article's start, four titles to choose
# from) against llama.cpp (llama-cpp-python, the same GGUF, the same threads; each record's
# prompt evaluated once and each choice after it from the cache). Prints a table: records
# and choices per second and the accuracy each engine finds (the same model: they should
# agree within the quantised kernels' rounding).
# Needs: target/release/resident, scripts/fetch-model.sh smollm2-135m-instruct,
# scripts/fetch-data.sh, and for the llama.cpp row a venv with llama-cpp-python 0.3.36
# (scripts/make-llama-cpp-fixture.py says how; LLAMA_PY= its python, default
# target/llama-venv/bin/python; the row is left out where it is missing).
# FLAGS= adds flags to resident's run (`--dtype f32`: the dense engine and its paged cache;
# both engines compute a question's prompt once for its choices); LLAMA=0 leaves the
# llama.cpp row out.
# Usage: RECORDS=500 WORDS=40 THREADS=2 OUT=/tmp/choice-bench [RESIDENT=path] [FLAGS=...] benches/choice-bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."
records=${RECORDS:-500}
words=${WORDS:-40}
threads=${THREADS:-$(nproc)}
out=${OUT:-/tmp/choice-bench}
model=models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf
llama_py=${LLAMA_PY:-target/llama-venv/bin/python}
rm -rf "$out" && mkdir -p "$out"
python3 benches/make_choice_set.py data/wiki_vital.jsonl "$records" "$words" > "$out/set.jsonl"
"${RESIDENT:-target/release/resident}" generate --input "$out/set.jsonl" --model "$model" \
  --output "$out/resident" --score --max-new-tokens 0 --template none ${FLAGS:-} > "$out/resident.log" 2>&1
if [[ -x "$llama_py" && "${LLAMA:-1}" != 0 ]]; then
  "$llama_py" benches/choice_llama_cpp.py "$model" "$out/set.jsonl" "$threads" > "$out/llama.json"
fi
python3 - "$out" "$threads" <<'PY'
import json, os, sys
out, threads = sys.argv[1], sys.argv[2]
report = json.load(open(f"{out}/resident/report.json"))
choices = sum(len(json.loads(l)["choices"]) for l in open(f"{out}/set.jsonl"))
flags = os.environ.get("FLAGS", "")
rows = [(f"resident generate --score {flags} (whole job: start, load, score, write)".replace("  ", " "),
         report["choice_records"], choices, report["wall_seconds"], report["accuracy"],
         report["accuracy_normalized"])]
if os.path.exists(f"{out}/llama.json"):
    llama = json.load(open(f"{out}/llama.json"))
    rows.append(("llama.cpp, llama-cpp-python: prompt once, each choice from its cache (loading excluded)",
                 llama["records"], llama["choices"], llama["seconds"], llama["accuracy"],
                 llama["accuracy_normalized"]))
print(f"| engine ({threads} threads) | records | choices | s | records/s | accuracy | per character |")
print("|---|---:|---:|---:|---:|---:|---:|")
for name, records, choices, seconds, accuracy, normalized in rows:
    print(f"| {name} | {records} | {choices} | {seconds:.1f} | {records / seconds:,.1f} | {accuracy:.3f} | {normalized:.3f} |")
PY
