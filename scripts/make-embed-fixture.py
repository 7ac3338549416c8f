"""Regenerates a parity fixture: ~50 real texts and the vectors sentence-transformers gives
for them, with all-MiniLM-L6-v2 (tests/fixtures/minilm_parity.json) or all-mpnet-base-v2
(tests/fixtures/mpnet_parity.json). Short texts, typical lead sections, and texts well over
the model's max_seq_length (truncated), in English and other scripts.

Usage (after scripts/fetch-model.sh [all-mpnet-base-v2] and scripts/fetch-data.sh):
    python3 -m venv .venv-st && .venv-st/bin/pip install sentence-transformers==6.2.0 torch==2.15.0
    HF_HUB_OFFLINE=1 .venv-st/bin/python scripts/make-embed-fixture.py [all-mpnet-base-v2]
"""
import json
import sys

from sentence_transformers import SentenceTransformer

FIXTURES = {
    "all-MiniLM-L6-v2": "tests/fixtures/minilm_parity.json",
    "all-mpnet-base-v2": "tests/fixtures/mpnet_parity.json",
}


def load(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def main():
    name = sys.argv[1] if len(sys.argv) > 1 else "all-MiniLM-L6-v2"
    out = FIXTURES[name]
    english = load("data/wiki_vital.jsonl")
    other = load("data/wiki_vital_multilingual.jsonl")
    by_length = sorted(english, key=lambda a: len(a["text"]))
    texts = []
    texts += [a["description"] for a in english[100:112] if a["description"]]  # short
    texts += [a["text"] for a in english[1000:1012]]  # typical lead sections
    texts += [a["text"] for a in by_length[-8:]]  # longest: well over 256 tokens
    texts += [a["text"] for a in other[0:5]]  # French
    texts += [a["text"] for a in other[-5:]]  # Spanish
    texts += [
        "",  # empty
        "Zürich, São Paulo, Kraków, Reykjavík: naïve café déjà vu.",
        "東京は日本の首都です。",
        "Привет, мир! Это проверка.",
        "emoji 🚀✨ and math ∑x² ≤ ∞",
        " ".join(a["text"] for a in english[2000:2004]),  # very long: truncated
        " ".join(a["text"] for a in english[3000:3008]),  # past 384 tokens (MPNet's limit)
        " ".join(a["text"] for a in english[4000:4012]),
    ]
    model = SentenceTransformer(f"models/{name}", device="cpu")
    vectors = model.encode(texts, batch_size=32, normalize_embeddings=False, convert_to_numpy=True)
    tokenizer = model.tokenizer
    fixture = {
        "model": f"sentence-transformers/{name}",
        "generated_by": "scripts/make-embed-fixture.py with sentence-transformers "
        + __import__("sentence_transformers").__version__,
        "max_seq_length": model.max_seq_length,
        "texts": texts,
        "token_counts": [len(tokenizer(t)["input_ids"]) for t in texts],
        "vectors": [[round(float(x), 7) for x in v] for v in vectors],
    }
    with open(out, "w", encoding="utf-8") as f:
        json.dump(fixture, f, ensure_ascii=False)
    long = sum(1 for n in fixture["token_counts"] if n > model.max_seq_length)
    print(f"wrote {out}: {len(texts)} texts ({long} over {model.max_seq_length} tokens)")


if __name__ == "__main__":
    main()
