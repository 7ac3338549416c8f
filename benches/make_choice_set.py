"""A multiple-choice set from Wikipedia leads for benches/choice-bench.sh: each record is the
start of an article's lead, then "This passage is about", with four titles to choose from
(the article's own and the next three articles'), the right one's place turning with the
record. Real text, real distractors, a known answer: what an lm-evaluation-harness task
holds, from the corpus the repository already fetches.

Usage: python make_choice_set.py data/wiki_vital.jsonl RECORDS WORDS > set.jsonl
"""
import json
import sys

path, records, words = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
articles = []
for line in open(path):
    article = json.loads(line)
    if article.get("title") and len(article["text"].split()) >= words:
        articles.append(article)
    if len(articles) == records + 3:
        break
for i, article in enumerate(articles[:records]):
    titles = [articles[i + k]["title"] for k in range(4)]
    place = i % 4
    titles[0], titles[place] = titles[place], titles[0]
    lead = " ".join(article["text"].split()[:words])
    print(json.dumps({
        "id": article["id"],
        "text": f"{lead} ...\nThis passage is about",
        "choices": [f" {title}" for title in titles],
        "answer": place,
    }))
