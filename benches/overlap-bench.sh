#!/usr/bin/env bash
# What `--metric` costs per record, and whether its figures are rouge-score's and sacrebleu's
# on many pairs: PAIRS answer-reference pairs from Wikipedia articles (the answer an article's
# first three sentences, the reference its second to fourth on lines, every third pair with
# its first sentence as a second reference) scored by `overlap-bench` (ours, each figure
# timed alone) and by rouge-score 0.1.2 and sacrebleu 2.6 (PY, default the test venv's
# python, which scripts/test-python.sh fills), with the largest difference between the two.
# Needs scripts/fetch-data.sh. Usage: PAIRS=2000 OUT=/tmp/overlap-bench benches/overlap-bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."
pairs=${PAIRS:-2000}
out=${OUT:-/tmp/overlap-bench}
py=${PY:-target/python-venv/bin/python}
rm -rf "$out" && mkdir -p "$out"
python3 - "$pairs" > "$out/pairs.jsonl" <<'PY'
import json, re, sys
wanted, written = int(sys.argv[1]), 0
for line in open("data/wiki_vital.jsonl"):
    sentences = re.split(r"(?<=[.!?]) ", json.loads(line)["text"])
    if len(sentences) < 4 or written == wanted:
        continue
    references = ["\n".join(sentences[1:4])] + ([sentences[0]] if written % 3 == 0 else [])
    print(json.dumps({"answer": " ".join(sentences[:3]), "references": references}))
    written += 1
PY
cargo run -q --release --locked -p resident-bench --bin overlap-bench -- "$out/pairs.jsonl" "$out/ours.jsonl"
echo
cpu=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
"$py" benches/overlap_reference.py "$out/pairs.jsonl" "$out/ours.jsonl" "$cpu"
