"""Regenerates tests/fixtures/smollm2_llama_cpp_scores.json: llama.cpp's log-probability of
each token of Wikipedia texts under the SmolLM2-135M-Instruct Q4_1 GGUF that
`resident generate --score` is tested on (tests/tests/suite/generate_score.rs reads it).

Two cases over the first 24 articles of tests/fixtures/wiki_sample.jsonl.json:
  plain     the text alone (the default prompt `{text}`): every token after the first,
            given the tokens before it;
  context   `{description}. ` before the text: the text's tokens given the description
            and the text before them (lm-evaluation-harness's loglikelihood: context and
            continuation tokenised apart and joined).
Each token's log-probability is a float64 log-softmax of llama.cpp's logits for the row
before it, written as the range llama.cpp's own settings span (VARIANTS, as in
make-llama-cpp-fixture.py), with the tokens and their sums.

Usage (after scripts/fetch-model.sh smollm2-135m-instruct; the same venv as
make-llama-cpp-fixture.py, whose docstring says how to build it):
    target/llama-venv/bin/python scripts/make-llama-cpp-scores.py
"""
import hashlib
import json

import numpy as np
import llama_cpp as L

MODEL = "models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf"
SAMPLE = "tests/fixtures/wiki_sample.jsonl.json"
OUT = "tests/fixtures/smollm2_llama_cpp_scores.json"
ARTICLES = 24
VARIANTS = {
    "default": {},
    "flash_attn": {"flash_attn": True},
    "kv_f32": {"type_k": 0, "type_v": 0},
}


def tokens(llm, text):
    return llm.tokenize(text.encode(), add_bos=False, special=False)


def logprobs(llm, prompt, start):
    """The log-probability of each of `prompt`'s tokens from `start` (at least 1) on."""
    llm.reset()
    llm.eval(prompt)
    scores = np.asarray(llm.scores[: len(prompt)], dtype=np.float64)
    out = []
    for pos in range(max(start, 1), len(prompt)):
        row = scores[pos - 1]
        top = row.max()
        log_total = top + np.log(np.exp(row - top).sum())
        out.append(float(row[prompt[pos]] - log_total))
    return out


def main():
    articles = json.load(open(SAMPLE))[:ARTICLES]
    cases = {"plain": [], "context": []}
    per_variant = {}
    for name, settings in VARIANTS.items():
        llm = L.Llama(
            model_path=MODEL, n_ctx=2048, n_threads=2, n_threads_batch=2, verbose=False,
            logits_all=True, **settings,
        )
        runs = []
        for article in articles:
            text = tokens(llm, article["text"])
            context = tokens(llm, article["description"] + ". ")
            runs.append({
                "plain": (text, 1, logprobs(llm, text, 1)),
                "context": (context + text, len(context), logprobs(llm, context + text, len(context))),
            })
        per_variant[name] = runs
    for i, article in enumerate(articles):
        for case in cases:
            prompt, start, _ = per_variant["default"][i][case]
            spans = np.array([per_variant[v][i][case][2] for v in VARIANTS])
            cases[case].append({
                "id": article["id"],
                "tokens": prompt[max(start, 1):],
                "logprob_min": spans.min(axis=0).round(6).tolist(),
                "logprob_max": spans.max(axis=0).round(6).tolist(),
                "sum": [round(float(s), 6) for s in spans.sum(axis=1)],
            })
    fixture = {
        "model": MODEL,
        "model_sha256": hashlib.sha256(open(MODEL, "rb").read()).hexdigest(),
        "llama_cpp_python": L.__version__,
        "variants": list(VARIANTS),
        "context_prompt": "{description}. {text}",
        **cases,
    }
    # One line per text: the file stays readable in a diff without a line per number.
    with open(OUT, "w") as f:
        head = {k: v for k, v in fixture.items() if k not in cases}
        f.write("{\n" + ",\n".join(f" {json.dumps(k)}: {json.dumps(v)}" for k, v in head.items()))
        for case in cases:
            rows = ",\n".join("  " + json.dumps(row) for row in fixture[case])
            f.write(f',\n {json.dumps(case)}: [\n{rows}\n ]')
        f.write("\n}\n")


if __name__ == "__main__":
    main()
