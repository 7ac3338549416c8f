"""llama.cpp's side of benches/choice-bench.sh: each record's choices scored after its
prompt with llama-cpp-python on the same GGUF, as `resident generate --score` scores them
(the prompt, its trailing whitespace moved to the choice, and each choice tokenised apart;
BOS first where the model asks for it). The prompt is evaluated once a record and each
choice after it from the same cache (its rows rolled back between choices), the most a
llama.cpp user gets without writing a batch scheduler.

Usage: python choice_llama_cpp.py MODEL SET.jsonl THREADS
Prints one JSON line: records, choices, seconds (loading excluded), accuracy (likeliest
choice) and accuracy_normalized (likeliest per character).
"""
import json
import sys
import time

import numpy as np
import llama_cpp as L

model, path, threads = sys.argv[1], sys.argv[2], int(sys.argv[3])
records = [json.loads(line) for line in open(path)]
llm = L.Llama(
    model_path=model, n_ctx=4096, n_batch=512, n_threads=threads, n_threads_batch=threads,
    logits_all=True, verbose=False,
)
add_bos = llm.metadata.get("tokenizer.ggml.add_bos_token", "false") == "true"


def log_softmax(rows):
    top = rows.max(axis=1, keepdims=True)
    return rows - (top + np.log(np.exp(rows - top).sum(axis=1, keepdims=True)))


start = time.perf_counter()
choices_scored, right, right_normalized = 0, 0, 0
for record in records:
    context = record["text"]
    kept = context.rstrip()
    head = llm.tokenize(kept.encode(), add_bos=add_bos, special=False)
    llm.reset()
    llm.eval(head)
    scores = []
    for choice in record["choices"]:
        tokens = llm.tokenize((context[len(kept):] + choice).encode(), add_bos=False, special=False)
        llm.n_tokens = len(head)
        llm.eval(tokens)
        rows = np.asarray(llm.scores[len(head) - 1 : len(head) + len(tokens) - 1], dtype=np.float64)
        scores.append(float(log_softmax(rows)[np.arange(len(tokens)), tokens].sum()))
    choices_scored += len(scores)
    chars = [max(len(c), 1) for c in record["choices"]]
    right += int(np.argmax(scores)) == record["answer"]
    right_normalized += int(np.argmax(np.array(scores) / chars)) == record["answer"]
seconds = time.perf_counter() - start
print(json.dumps({
    "records": len(records), "choices": choices_scored, "seconds": seconds,
    "accuracy": right / len(records), "accuracy_normalized": right_normalized / len(records),
}))
