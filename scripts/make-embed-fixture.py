"""Regenerates tests/fixtures/minilm_parity.json: ~50 real texts and the vectors
sentence-transformers gives for them with all-MiniLM-L6-v2.

Usage (after scripts/fetch-model.sh and scripts/fetch-data.sh):
    python3 -m venv .venv-st && .venv-st/bin/pip install sentence-transformers==6.2.0 torch==2.15.0
    HF_HUB_OFFLINE=1 .venv-st/bin/python scripts/make-embed-fixture.py
"""
import json

from sentence_transformers import SentenceTransformer

MODEL = "models/all-MiniLM-L6-v2"


def load(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def main():
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
    ]
    model = SentenceTransformer(MODEL, device="cpu")
    vectors = model.encode(texts, batch_size=32, normalize_embeddings=False, convert_to_numpy=True)
    tokenizer = model.tokenizer
    fixture = {
        "model": "sentence-transformers/all-MiniLM-L6-v2",
        "generated_by": "scripts/make-embed-fixture.py with sentence-transformers "
        + __import__("sentence_transformers").__version__,
        "max_seq_length": model.max_seq_length,
        "texts": texts,
        "token_counts": [len(tokenizer(t)["input_ids"]) for t in texts],
        "vectors": [[round(float(x), 7) for x in v] for v in vectors],
    }
    with open("tests/fixtures/minilm_parity.json", "w", encoding="utf-8") as f:
        json.dump(fixture, f, ensure_ascii=False)
    long = sum(1 for n in fixture["token_counts"] if n > model.max_seq_length)
    print(f"wrote {len(texts)} texts ({long} over {model.max_seq_length} tokens)")


if __name__ == "__main__":
    main()
