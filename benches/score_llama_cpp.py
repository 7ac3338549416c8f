"""llama.cpp's side of benches/score-bench.sh: each text's log-probability under a GGUF, as
`resident generate --score` computes it (the text's tokens without BOS, every token after
the first scored from the logits of the row before it), with llama-cpp-python.

Usage: python score_llama_cpp.py MODEL INPUT.jsonl THREADS
Prints one JSON line: texts, tokens, seconds (loading excluded), eval_seconds (llama.cpp's
own forward passes, without the Python log-softmax over the rows' logits), perplexity over
them all.
"""
import json
import sys
import time

import numpy as np
import llama_cpp as L

model, path, threads = sys.argv[1], sys.argv[2], int(sys.argv[3])
texts = [json.loads(line)["text"] for line in open(path)]
llm = L.Llama(
    model_path=model, n_ctx=8192, n_batch=512, n_threads=threads, n_threads_batch=threads,
    logits_all=True, verbose=False,
)
start = time.perf_counter()
tokens_scored, logprob, eval_seconds = 0, 0.0, 0.0
for text in texts:
    tokens = llm.tokenize(text.encode(), add_bos=False, special=False)[: 8192 - 1]
    llm.reset()
    before = time.perf_counter()
    llm.eval(tokens)
    eval_seconds += time.perf_counter() - before
    rows = np.asarray(llm.scores[: len(tokens) - 1], dtype=np.float64)
    top = rows.max(axis=1, keepdims=True)
    log_total = (top + np.log(np.exp(rows - top).sum(axis=1, keepdims=True)))[:, 0]
    logprob += float((rows[np.arange(len(tokens) - 1), tokens[1:]] - log_total).sum())
    tokens_scored += len(tokens) - 1
seconds = time.perf_counter() - start
print(json.dumps({
    "texts": len(texts), "tokens": tokens_scored, "seconds": seconds, "eval_seconds": eval_seconds,
    "perplexity": float(np.exp(-logprob / tokens_scored)),
}))
