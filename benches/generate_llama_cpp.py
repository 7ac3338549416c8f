"""llama.cpp (llama-cpp-python from PyPI) on the prompt tokens `generate-bench --prompts-out`
wrote: greedy, up to N new tokens, ending at the model's end of generation, as issue 31's
speed comparison asks. Prints a markdown table row per setting.

Two ways a user drives it:
  completion   `Llama.create_completion` one prompt at a time (the high-level API);
  batched:B    B sequences in flight through one context (the low-level `llama_decode`
               with a sequence id per prompt), refilled as they finish, decode rows first
               and prompt chunks in what is left of each step's batch: the policy of
               llama.cpp's own server and of our engine.

  target/release/generate-bench --prompts 200 --prompts-out /tmp/p200.jsonl
  python benches/generate_llama_cpp.py /tmp/p200.jsonl MODEL.gguf --modes completion,batched:8,batched:32

Issue 45's decoding modes (`generate-bench --decoding plain,penalties,schema`), one prompt
at a time, each run to its token limit:
  python benches/generate_llama_cpp.py /tmp/p64.jsonl MODEL.gguf --ignore-eos \
      --modes completion,completion:penalties,completion:schema

A host that lists AMX without granting it (scripts/make-llama-cpp-fixture.py says how to
build llama-cpp-python without AMX there) crashes in the first decode.
"""

import argparse
import ctypes
import json
import time

import numpy as np
import llama_cpp as L


# generate-bench's `summary_schema`, for `completion:schema`, less the summary's
# `maxLength: 1200`: llama.cpp's GBNF conversion refuses that many repetitions ("exceeds
# sane defaults") and then crashes. At 128 new tokens no summary reaches 1,200 characters,
# so both engines are held to the same documents.
SUMMARY_SCHEMA = {
    "type": "object",
    "properties": {
        "summary": {"type": "string"},
        "keywords": {"type": "array", "items": {"type": "string", "maxLength": 40}, "maxItems": 12},
        "tone": {"enum": ["neutral", "positive", "negative"]},
    },
    "required": ["summary", "keywords", "tone"],
    "additionalProperties": False,
}


def decoding_options(llm, decoding, ignore_eos):
    """`create_completion`'s arguments for generate-bench's `--decoding` modes: `plain`
    (greedy), `penalties` (repetition 1.1, presence 0.5, frequency 0.5: llama.cpp's own
    penalties; the 0.3.36 binding passes `n_vocab` where llama.cpp now reads its window,
    so they count every token seen, not the last 64) and `schema` (the summary schema as a GBNF grammar,
    llama.cpp's own JSON-schema conversion)."""
    options = {"temperature": 0.0, "top_k": 1}
    if ignore_eos:
        options["logit_bias"] = {llm.token_eos(): float("-inf")}
    if decoding == "penalties":
        options.update(repeat_penalty=1.1, presence_penalty=0.5, frequency_penalty=0.5)
    elif decoding == "schema":
        options["grammar"] = L.LlamaGrammar.from_json_schema(json.dumps(SUMMARY_SCHEMA), verbose=False)
    elif decoding != "plain":
        raise SystemExit(f"completion:{decoding}: use plain, penalties or schema")
    return options


def completion(path, prompts, new_tokens, threads, decoding="plain", ignore_eos=False):
    llm = L.Llama(
        model_path=path, n_ctx=4096, n_threads=threads, n_threads_batch=threads,
        n_batch=512, verbose=False,
    )
    options = decoding_options(llm, decoding, ignore_eos)
    generated = 0
    start = time.time()
    for prompt in prompts:
        llm.reset()
        out = llm.create_completion(prompt, max_tokens=new_tokens, **options)
        generated += out["usage"]["completion_tokens"]
    return generated, time.time() - start


FLASH_ATTN = {"auto": -1, "off": 0, "on": 1}


def batched(path, prompts, new_tokens, threads, width, flash_attn="auto", step_tokens=512):
    L.llama_backend_init()
    model = L.llama_model_load_from_file(path.encode(), L.llama_model_default_params())
    longest = max(len(p) for p in prompts) + new_tokens + 8
    params = L.llama_context_default_params()
    params.n_ctx = width * longest
    params.n_batch = params.n_ubatch = step_tokens
    params.n_seq_max = width
    params.n_threads = params.n_threads_batch = threads
    params.flash_attn_type = FLASH_ATTN[flash_attn]
    ctx = L.llama_init_from_model(model, params)
    vocab = L.llama_model_get_vocab(model)
    n_vocab = L.llama_vocab_n_tokens(vocab)
    memory = L.llama_get_memory(ctx)
    batch = L.llama_batch_init(step_tokens, 0, 1)

    waiting = list(range(len(prompts)))[::-1]
    # Per slot: [prompt index, tokens so far, positions cached, new tokens] or None.
    slots = [None] * width
    generated = 0
    start = time.time()
    while waiting or any(slots):
        for s in range(width):
            if slots[s] is None and waiting:
                i = waiting.pop()
                L.llama_memory_seq_rm(memory, s, -1, -1)
                slots[s] = [i, list(prompts[i]), 0, 0]
        rows = []  # (slot, token, pos, wants logits)
        for s, seq in enumerate(slots):
            if seq and seq[2] + 1 == len(seq[1]):
                rows.append((s, seq[1][-1], seq[2], True))
        for s, seq in enumerate(slots):
            if not seq or seq[2] + 1 == len(seq[1]) or len(rows) >= step_tokens:
                continue
            end = min(len(seq[1]), seq[2] + step_tokens - len(rows))
            for pos in range(seq[2], end):
                rows.append((s, seq[1][pos], pos, pos == len(seq[1]) - 1))
        batch.n_tokens = len(rows)
        for k, (s, token, pos, logits) in enumerate(rows):
            batch.token[k] = token
            batch.pos[k] = pos
            batch.n_seq_id[k] = 1
            batch.seq_id[k][0] = s
            batch.logits[k] = logits
        if L.llama_decode(ctx, batch) != 0:
            raise SystemExit("llama_decode failed: make the context larger")
        for k, (s, token, pos, logits) in enumerate(rows):
            seq = slots[s]
            seq[2] = pos + 1
            if not logits:
                continue
            scores = np.ctypeslib.as_array(
                ctypes.cast(L.llama_get_logits_ith(ctx, k), ctypes.POINTER(ctypes.c_float)),
                shape=(n_vocab,),
            )
            token = int(scores.argmax())
            seq[3] += 1
            generated += 1
            if L.llama_vocab_is_eog(vocab, token) or seq[3] >= new_tokens:
                slots[s] = None
            else:
                seq[1].append(token)
    wall = time.time() - start
    L.llama_batch_free(batch)
    L.llama_free(ctx)
    L.llama_model_free(model)
    return generated, wall


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("prompts", help="JSONL of {id, prompt} from generate-bench --prompts-out")
    parser.add_argument("model", help="the GGUF file")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--ignore-eos", action="store_true",
                        help="completion modes run to --max-new-tokens (the end token's logit at -inf); "
                             "batched modes ignore it")
    parser.add_argument("--limit", type=int, default=None, help="the first N prompts only")
    parser.add_argument("--modes", default="completion,batched:8,batched:32",
                        help="completion or completion:DECODING (plain, penalties, schema), batched:B, batched:B:FLASH or batched:B:FLASH:STEP (FLASH: auto, "
                             "the default, on or off; STEP: tokens a decode call, 512 by default)")
    args = parser.parse_args()
    prompts = [json.loads(line)["prompt"] for line in open(args.prompts)][: args.limit]
    prompt_tokens = sum(len(p) for p in prompts)
    print(f"llama-cpp-python {L.__version__}, {len(prompts)} prompts, {prompt_tokens} prompt tokens, "
          f"up to {args.max_new_tokens} new tokens, {args.threads} threads")
    print()
    print("| llama.cpp | generated tokens | wall s | generated tokens/s | prompt + generated tokens/s |")
    print("|---|---:|---:|---:|---:|")
    for mode in args.modes.split(","):
        if mode == "completion" or mode.startswith("completion:"):
            decoding = mode.split(":")[1] if ":" in mode else "plain"
            generated, wall = completion(args.model, prompts, args.max_new_tokens, args.threads,
                                         decoding, args.ignore_eos)
        else:
            _, width, *rest = mode.split(":")
            flash = rest[0] if rest else "auto"
            step = int(rest[1]) if len(rest) > 1 else 512
            generated, wall = batched(args.model, prompts, args.max_new_tokens, args.threads,
                                      int(width), flash, step)
        print(f"| {mode} | {generated} | {wall:.1f} | {generated / wall:.1f} | "
              f"{(prompt_tokens + generated) / wall:.1f} |", flush=True)


if __name__ == "__main__":
    main()
