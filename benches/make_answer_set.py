"""Open-book questions with short answers from the Wikipedia leads (benches/answer-bench.sh):
each record is an article's first sentence and asks what it is about; its reference is the
article's title (the sentence usually names it). The first DEV articles are the few-shot
examples' split, the RECORDS after them the test split.

Usage: python3 make_answer_set.py data/wiki_vital.jsonl DEV RECORDS OUT_DIR"""

import json
import sys

source, dev, records, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]


def first_sentence(text: str) -> str:
    end = text.find(". ")
    return text[: end + 1] if 0 < end < 300 else text[:300]


rows = []
for line in open(source):
    article = json.loads(line)
    # Titles that are plain words: numbers and years make a different task.
    if not article["title"][0].isalpha():
        continue
    rows.append({"id": article["id"], "text": first_sentence(article["text"]),
                 "answer": article["title"]})
    if len(rows) == dev + records:
        break
for name, part in (("dev", rows[:dev]), ("test", rows[dev:])):
    with open(f"{out}/{name}.jsonl", "w") as f:
        for row in part:
            f.write(json.dumps(row) + "\n")
