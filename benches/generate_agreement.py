"""Greedy decoding of Resident's generate engine against llama.cpp on the same GGUF and the
same prompt tokens.

    target/release/generate-bench --prompts 100 --max-new-tokens 16 --batches 32 \
        --dump /tmp/resident-greedy.jsonl
    python benches/generate_agreement.py /tmp/resident-greedy.jsonl \
        models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf

Needs `pip install llama-cpp-python numpy`. Prints how many prompts agree on the first token
and on the first 16, the first step's largest absolute logit difference, and for each fork
where it happens and llama.cpp's margin between its top two tokens there (a margin within
the logit differences is a quantisation fork, not a bug).

With `--reference-floor` it also measures llama.cpp against itself on the same prompts:
its default attention against its flash attention, the same model and tokens. The two
compute the same function in another order; how often they fork is the floor that no
other implementation's agreement can be expected to beat without copying one build's
arithmetic exactly.
"""

import json
import sys

import numpy as np
from llama_cpp import Llama


def llama_greedy(llm, prompt, steps):
    llm.reset()
    llm.eval(prompt)
    first = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
    logits = first
    tokens, margins = [], []
    for _ in range(steps):
        order = np.argsort(-logits)
        tokens.append(int(order[0]))
        margins.append(float(logits[order[0]] - logits[order[1]]))
        if int(order[0]) == llm.token_eos():
            break
        llm.eval([int(order[0])])
        logits = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
    return first, tokens, margins


def reference_floor(model, records):
    plain = Llama(model_path=model, n_ctx=4096, n_threads=2, logits_all=True, verbose=False)
    flash = Llama(model_path=model, n_ctx=4096, n_threads=2, logits_all=True, verbose=False,
                  flash_attn=True)
    first_same = sixteen_same = 0
    diffs = []
    for record in records:
        first_a, tokens_a, _ = llama_greedy(plain, record["prompt"], 16)
        first_b, tokens_b, _ = llama_greedy(flash, record["prompt"], 16)
        n = min(16, len(tokens_a), len(tokens_b))
        first_same += tokens_a[:1] == tokens_b[:1]
        sixteen_same += tokens_a[:n] == tokens_b[:n]
        diffs.append(float(np.abs(first_a - first_b).max()))
    print("llama.cpp against itself (default attention vs flash attention):")
    print(f"  first generated token identical: {first_same}")
    print(f"  first 16 tokens identical: {sixteen_same}")
    print(f"  first step, largest absolute logit difference: max {max(diffs):.3f}, "
          f"median {float(np.median(diffs)):.3f}")


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    dump, model = args[0], args[1]
    llm = Llama(model_path=model, n_ctx=4096, n_threads=2, logits_all=True, verbose=False)
    records = [json.loads(line) for line in open(dump)]
    first_same = sixteen_same = 0
    diffs, forks = [], []
    for record in records:
        ours = record["greedy"]
        steps = max(16, len(ours))
        first, theirs, margins = llama_greedy(llm, record["prompt"], min(steps, 16))
        if theirs and theirs[-1] == llm.token_eos():
            theirs = theirs[:-1]  # ours leaves the end-of-sequence token out
            ended = True
        else:
            ended = False
        diffs.append(float(np.abs(first - np.array(record["logits"], dtype=np.float32)).max()))
        n = min(16, len(theirs) if ended else 16)
        if ours[:1] == theirs[:1]:
            first_same += 1
        if ours[:n] == theirs[:n]:
            sixteen_same += 1
        else:
            at = next(i for i in range(n) if i >= len(ours) or ours[i] != theirs[i])
            forks.append((record["id"], at, margins[at] if at < len(margins) else None))
    print(f"prompts: {len(records)}")
    print(f"first generated token identical: {first_same}")
    print(f"first 16 tokens identical: {sixteen_same}")
    print(f"first step, largest absolute logit difference: max {max(diffs):.3f}, "
          f"median {float(np.median(diffs)):.3f}")
    for record_id, at, margin in forks:
        margin_text = "n/a" if margin is None else f"{margin:.3f}"
        print(f"fork: prompt {record_id} at token {at}, llama.cpp's top-2 margin there {margin_text}")
    if "--reference-floor" in sys.argv:
        reference_floor(model, records)


if __name__ == "__main__":
    main()
