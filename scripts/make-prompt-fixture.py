"""Regenerates tests/fixtures/minilm_prompts.json: what sentence-transformers gives for
prompts, truncate_dim, normalize_embeddings and every precision, on all-MiniLM-L6-v2 with a
prompts file added (no registry ships a small model with its own prompts).

The model directories are made the same way by the Rust tests (`prompted_minilm` in
tests/src/lib.rs): the real MiniLM files, plus
  config_sentence_transformers.json: {"prompts": PROMPTS, "default_prompt_name": "passage"}
and, for the "exclude" model, 1_Pooling/config.json with "include_prompt": false.

Usage (after scripts/fetch-model.sh and scripts/fetch-data.sh):
    python3 -m venv .venv-st && .venv-st/bin/pip install sentence-transformers==6.2.0 torch
    HF_HUB_OFFLINE=1 .venv-st/bin/python scripts/make-prompt-fixture.py
"""
import json
import os
import shutil
import tempfile

import numpy as np
from sentence_transformers import SentenceTransformer
from sentence_transformers.util.quantization import quantize_embeddings

PROMPTS = {"query": "query: ", "passage": "passage: "}
LITERAL = "Represent this sentence for searching relevant passages: "
SOURCE = "models/all-MiniLM-L6-v2"


def model_dir(root, include_prompt):
    out = os.path.join(root, f"minilm-prompts-{'in' if include_prompt else 'ex'}")
    shutil.copytree(SOURCE, out)
    with open(os.path.join(out, "config_sentence_transformers.json"), "w") as f:
        json.dump({"prompts": PROMPTS, "default_prompt_name": "passage"}, f)
    pooling = os.path.join(out, "1_Pooling", "config.json")
    with open(pooling) as f:
        config = json.load(f)
    config["include_prompt"] = include_prompt
    with open(pooling, "w") as f:
        json.dump(config, f)
    return out


def rows(array):
    return [[round(float(x), 7) for x in row] for row in array]


def main():
    with open("data/wiki_vital.jsonl", encoding="utf-8") as f:
        articles = [json.loads(line) for line in f]
    texts = [a["description"] for a in articles[200:210] if a["description"]]
    texts += [a["text"] for a in articles[500:506]]
    with tempfile.TemporaryDirectory() as root:
        included = SentenceTransformer(model_dir(root, True), device="cpu")
        excluded = SentenceTransformer(model_dir(root, False), device="cpu")

        def encode(model, **kwargs):
            return model.encode(texts, batch_size=8, convert_to_numpy=True, **kwargs)

        plain = encode(included, prompt="")
        cases = {
            "default": rows(encode(included)),
            "query": rows(encode(included, prompt_name="query")),
            "literal": rows(encode(included, prompt=LITERAL)),
            "none": rows(plain),
            "exclude_query": rows(encode(excluded, prompt_name="query")),
            "truncate_128": rows(encode(included, prompt="", truncate_dim=128)),
            "truncate_128_normalized": rows(
                encode(included, prompt="", truncate_dim=128, normalize_embeddings=True)
            ),
        }
        ranges = np.vstack((plain.min(axis=0), plain.max(axis=0)))
        quantized = {
            precision: quantize_embeddings(plain, precision, ranges=ranges).tolist()
            for precision in ["int8", "uint8", "binary", "ubinary"]
        }
    fixture = {
        "model": "sentence-transformers/all-MiniLM-L6-v2 with a prompts file added",
        "generated_by": "scripts/make-prompt-fixture.py with sentence-transformers "
        + __import__("sentence_transformers").__version__,
        "prompts": PROMPTS,
        "default_prompt_name": "passage",
        "literal_prompt": LITERAL,
        "texts": texts,
        "vectors": cases,
        "quantized_from_none": quantized,
        "ranges_from_none": rows(ranges),
    }
    with open("tests/fixtures/minilm_prompts.json", "w", encoding="utf-8") as f:
        json.dump(fixture, f, ensure_ascii=False)
        f.write("\n")


if __name__ == "__main__":
    main()
