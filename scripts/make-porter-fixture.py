#!/usr/bin/env python3
"""Writes tests/fixtures/porter_nltk.json: NLTK's Porter stems (the stemmer rouge-score's
use_stemmer=True runs) of Wikipedia's words, which jobs/src/corpus_job/porter_stem.rs is held
to. Words: ROUGE's tokens (lower-cased ASCII letters and digits) of data/wiki_vital.jsonl
(scripts/fetch-data.sh), the most frequent ones and those with each suffix the stemmer's
rules name, plus the irregular and odd forms. Needs nltk (pip install nltk).

    python3 scripts/make-porter-fixture.py
"""

import collections
import json
import re
from pathlib import Path

from nltk import __version__ as nltk_version
from nltk.stem import porter

REPO = Path(__file__).resolve().parent.parent
SUFFIXES = [
    "sses", "ies", "ied", "eed", "ed", "ing", "at", "bl", "iz", "y", "ational", "tional",
    "enci", "anci", "izer", "bli", "alli", "entli", "eli", "ousli", "ization", "ation", "ator",
    "alism", "iveness", "fulness", "ousness", "aliti", "iviti", "biliti", "fulli", "logi",
    "icate", "ative", "alize", "iciti", "ical", "ful", "ness", "al", "ance", "ence", "er", "ic",
    "able", "ible", "ant", "ement", "ment", "ent", "sion", "tion", "ou", "ism", "ate", "iti",
    "ous", "ive", "ize", "e", "ll",
]
ODD = [
    "sky", "skies", "dying", "lying", "tying", "news", "innings", "inning", "outings", "howe",
    "proceed", "exceed", "succeed", "dies", "died", "spied", "flies", "yyyy", "syzygy", "toy",
    "by", "y", "a", "is", "as", "1990s", "3d", "mp3s", "feed", "agreed", "bled", "sing", "fizzed",
    "hissing", "radicalli", "analogi", "logi", "fulli", "controll", "roll", "cease", "rate",
]


def main() -> None:
    counts = collections.Counter()
    with open(REPO / "data" / "wiki_vital.jsonl") as f:
        for line in f:
            text = json.loads(line)["text"].lower()
            counts.update(w for w in re.split(r"[^a-z0-9]+", text) if w)
    frequent = [w for w, _ in counts.most_common(3000)]
    by_suffix = []
    for suffix in SUFFIXES:
        having = [w for w, _ in counts.most_common() if w.endswith(suffix) and len(w) > 3]
        by_suffix.extend(having[:40])
    words = list(dict.fromkeys(ODD + frequent + by_suffix))
    stemmer = porter.PorterStemmer()
    fixture = {
        "nltk": nltk_version,
        "mode": stemmer.mode,
        "stems": {word: stemmer.stem(word) for word in words},
    }
    path = REPO / "tests" / "fixtures" / "porter_nltk.json"
    path.write_text(json.dumps(fixture, indent=0, sort_keys=False) + "\n")
    print(f"{len(words)} words into {path}")


if __name__ == "__main__":
    main()
