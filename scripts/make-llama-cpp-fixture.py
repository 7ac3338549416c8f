"""Regenerates tests/fixtures/smollm2_llama_cpp.json: what llama.cpp gives on the same
SmolLM2-135M-Instruct Q4_1 GGUF that `resident generate`'s tests run, for issue 45's
comparisons (tests/tests/suite/generate_llama_cpp.rs reads it):

  chat       greedy answers of llama-cpp-python's `create_chat_completion` (the GGUF's own
             chat template), with and without a system message;
  penalties  greedy continuations under one penalty each, with llama.cpp's own penalties
             sampler (`llama_sampler_init_penalties`) fed the history vLLM defines:
             repetition over the prompt's and the output's tokens, presence and frequency
             over the output's only; and the plain greedy continuation beside each;
  logprobs   each greedy step's top 5 log-probabilities (a float64 log-softmax of
             llama.cpp's logits, as llama-cpp-python's `logprobs` computes them);
  min_p      the first step's tokens llama.cpp's min-p sampler (`llama_sampler_init_min_p`)
             keeps.

Every case runs under three llama.cpp settings (VARIANTS) and a greedy path is kept up to
its first near tie (MIN_LEAD): `settled_text`. Tokens are compared by their bytes, which
`resident generate --logprobs` writes.

Usage (after scripts/fetch-model.sh smollm2-135m-instruct; llama-cpp-python builds
llama.cpp with CMake, several minutes on 2 cores):
    python3 -m venv target/llama-venv
    target/llama-venv/bin/pip install llama-cpp-python==0.3.36 numpy
    target/llama-venv/bin/python scripts/make-llama-cpp-fixture.py
On a host whose CPU lists AMX (amx_tile) but whose kernel does not grant it to processes (a
virtual machine, say), llama.cpp's native build dies in its first decode (a general
protection fault on `ldtilecfg` in libggml-cpu.so); build it without AMX there:
    flags='-mno-amx-tile -mno-amx-int8 -mno-amx-bf16'
    CMAKE_ARGS="-DCMAKE_C_FLAGS='$flags' -DCMAKE_CXX_FLAGS='$flags'" target/llama-venv/bin/pip install --no-cache-dir llama-cpp-python==0.3.36 numpy
"""
import ctypes
import hashlib
import json
import os

import numpy as np
import llama_cpp as L

MODEL = "models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf"
OUT = "tests/fixtures/smollm2_llama_cpp.json"
DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

SYSTEM = "You are a pirate. Answer every question in pirate speech."
QUESTIONS = [
    "What is the capital of France?",
    "Name three colours.",
    "How do plants make food?",
    "Describe the sea.",
    "What is a computer?",
    "Who wrote Romeo and Juliet?",
    "Give me a tip for sleeping well.",
    "What is rain?",
    "Tell me about dogs.",
    "How many legs does a spider have?",
]
CHAT_TOKENS = 8

PENALTY_PROMPTS = [
    "Write the word 'data' eight times.",
    "List the days of the week.",
    "Count from one to twenty in words.",
    "List the months of the year.",
    "Name five fruits, one per line.",
    "Write a list of ten animals.",
]
PENALTIES = [
    {"repetition_penalty": 1.5},
    {"presence_penalty": -2.0},
    {"frequency_penalty": -1.0},
]
PENALTY_TOKENS = 24

LOGPROB_PROMPTS = [
    "What is the capital of France?",
    "Tell me about the moon.",
    "What is water made of?",
    "Explain what a bicycle is.",
    "Why is the sky blue?",
    "Who was Albert Einstein?",
]
LOGPROB_TOKENS = 8
TOP = 5

MIN_P_PROMPT = "Write a short poem about autumn."

# A greedy path is compared up to its first step where the settings choose differently or
# a choice leads the next token by less than this many nats under some setting: our
# kernels round differently from llama.cpp's, as its settings do from each other, and a
# closer call is a coin toss between engines, not a test.
MIN_LEAD = 0.3
MIN_P = 0.2


def chatml(user, system=None):
    system = system or DEFAULT_SYSTEM
    return (
        f"<|im_start|>system\n{system}<|im_end|>\n"
        f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"
    )


# llama.cpp against itself: its default settings, flash attention on, and the KV cache in
# f32 rather than f16 move a log-probability of this small model by up to about 0.3 nat and
# so flip near-tied greedy choices. Paths are compared up to their first near tie (see
# MIN_LEAD), and log-probabilities are written as the range the settings span.
VARIANTS = {
    "default": {},
    "flash_attn": {"flash_attn": True},
    "kv_f32": {"type_k": 0, "type_v": 0},
}


class Model:
    def __init__(self, path, **settings):
        self.llm = L.Llama(
            model_path=path, n_ctx=2048, n_threads=2, n_threads_batch=2, verbose=False,
            **settings,
        )
        self.vocab = L.llama_model_get_vocab(self.llm._model.model)
        self.n_vocab = L.llama_vocab_n_tokens(self.vocab)
        self.eos = {self.llm.token_eos()} | {
            t for t in range(self.n_vocab) if L.llama_vocab_is_eog(self.vocab, t)
        }

    def tokens(self, text):
        return self.llm.tokenize(text.encode(), add_bos=True, special=True)

    def piece(self, token):
        """The bytes `token` stands for (what `resident generate`'s logprobs call `bytes`)."""
        return list(self.llm.detokenize([token], special=True))

    def text(self, tokens):
        return self.llm.detokenize(tokens).decode("utf-8", errors="replace")

    def start(self, prompt_tokens):
        self.llm.reset()
        self.llm.eval(prompt_tokens)

    def logits(self):
        pointer = L.llama_get_logits_ith(self.llm._ctx.ctx, -1)
        return np.ctypeslib.as_array(pointer, shape=(self.n_vocab,)).astype(np.float64)

    def applied(self, sampler, logits):
        """`logits` after llama.cpp's `sampler` (by token id; a dropped token at -inf)."""
        data = (L.llama_token_data * self.n_vocab)()
        for i, logit in enumerate(logits):
            data[i].id, data[i].logit, data[i].p = i, float(logit), 0.0
        array = L.llama_token_data_array(data=data, size=self.n_vocab, selected=-1, sorted=False)
        L.llama_sampler_apply(sampler, ctypes.byref(array))
        out = np.full(self.n_vocab, -np.inf)
        for i in range(array.size):
            out[array.data[i].id] = array.data[i].logit
        return out

    def greedy(self, prompt_tokens, steps, penalties=None):
        """Greedy tokens after `prompt_tokens` (under llama.cpp's penalties sampler when
        `penalties` are given), and the lead of each chosen token's logit (the end token's
        last, where it was chosen) over the
        next one's at each step."""
        sampler = None
        if penalties:
            repetition = penalties.get("repetition_penalty", 1.0)
            # The binding (0.3.36) declares an `n_vocab` before `penalty_last_n` that
            # llama.cpp's function no longer takes: with both 4096, the window is 4096
            # tokens (the whole history here) whichever the library reads.
            sampler = L.llama_sampler_init_penalties(
                4096,
                4096,
                repetition,
                penalties.get("frequency_penalty", 0.0),
                penalties.get("presence_penalty", 0.0),
            )
            if repetition != 1.0:
                # vLLM's repetition penalty counts the prompt's tokens too.
                for token in prompt_tokens:
                    L.llama_sampler_accept(sampler, token)
        self.start(prompt_tokens)
        out, leads = [], []
        for _ in range(steps):
            logits = self.logits()
            if sampler is not None:
                logits = self.applied(sampler, logits)
            first, second = np.argsort(-logits, kind="stable")[:2]
            leads.append(float(logits[first] - logits[second]))
            token = int(first)
            if sampler is not None:
                L.llama_sampler_accept(sampler, token)
            if token in self.eos:
                break
            out.append(token)
            self.llm.eval([token])
        if sampler is not None:
            L.llama_sampler_free(sampler)
        return out, leads

    def min_p_kept(self, prompt_tokens, min_p):
        """The first step's tokens llama.cpp's min-p sampler keeps."""
        self.start(prompt_tokens)
        sampler = L.llama_sampler_init_min_p(min_p, 1)
        kept = np.flatnonzero(np.isfinite(self.applied(sampler, self.logits())))
        L.llama_sampler_free(sampler)
        return [int(t) for t in kept]


def log_softmax(logits):
    shifted = logits - logits.max()
    return shifted - np.log(np.exp(shifted).sum())


def settled(model, results):
    """The greedy path every setting takes, up to its first near tie: `(tokens, ended)`,
    where `ended` says the end token was chosen, settled, right after them."""
    paths = [tokens for tokens, _ in results]
    count = 0
    longest = max(len(leads) for _, leads in results)
    while count < longest:
        chosen = {tuple(path[count : count + 1]) for path in paths}
        leads = [l[count] if count < len(l) else -1.0 for _, l in results]
        if len(chosen) != 1 or min(leads) < MIN_LEAD:
            break
        count += 1
    tokens = paths[0][:count]
    return tokens, count > len(tokens)


def case(model, results, **fields):
    tokens, ended = settled(model, results)
    return dict(fields, settled_tokens=len(tokens), settled_text=model.text(tokens), ended=ended)


def main():
    models = {name: Model(MODEL, **settings) for name, settings in VARIANTS.items()}
    model = models["default"]
    fixture = {
        "source": "scripts/make-llama-cpp-fixture.py",
        "llama_cpp_python": L.__version__,
        "model": MODEL,
        "model_sha256": hashlib.sha256(open(MODEL, "rb").read()).hexdigest(),
        "settings": VARIANTS,
        "min_lead": MIN_LEAD,
        "default_system": DEFAULT_SYSTEM,
        "system": SYSTEM,
        "chat": [],
        "penalties": [],
        "logprobs": [],
    }
    for question in QUESTIONS:
        for system in (None, SYSTEM):
            messages = ([{"role": "system", "content": system}] if system else []) + [
                {"role": "user", "content": question}
            ]
            model.llm.reset()
            answer = model.llm.create_chat_completion(
                messages, max_tokens=CHAT_TOKENS, temperature=0.0, top_k=1
            )
            text = answer["choices"][0]["message"]["content"]
            # The same prompt in ChatML by hand, through every setting: the template's
            # rendering is checked, and the path is followed up to its first near tie.
            tokens = model.tokens(chatml(question, system))
            assert len(tokens) == answer["usage"]["prompt_tokens"], question
            results = [m.greedy(tokens, CHAT_TOKENS) for m in models.values()]
            assert model.text(results[0][0]) == text, (question, text)
            fixture["chat"].append(
                case(model, results, question=question, system=system, text=text,
                     prompt_tokens=len(tokens))
            )
    for user in PENALTY_PROMPTS:
        prompt = chatml(user)
        tokens = model.tokens(prompt)
        plain = case(model, [m.greedy(tokens, PENALTY_TOKENS) for m in models.values()])
        for penalty in PENALTIES:
            results = [m.greedy(tokens, PENALTY_TOKENS, penalty) for m in models.values()]
            fixture["penalties"].append(
                case(model, results, prompt=prompt, prompt_tokens=len(tokens), penalty=penalty,
                     text=model.text(results[0][0]), plain=plain)
            )
    for user in LOGPROB_PROMPTS:
        prompt = chatml(user)
        tokens = model.tokens(prompt)
        greedy, _ = settled(model, [m.greedy(tokens, LOGPROB_TOKENS) for m in models.values()])
        # Each settled step's log-softmax under every setting.
        per_setting = []
        for m in models.values():
            m.start(tokens)
            rows = []
            for token in greedy:
                rows.append(log_softmax(m.logits()))
                m.llm.eval([token])
            per_setting.append(np.stack(rows) if rows else np.zeros((0, m.n_vocab)))
        low, high = np.min(per_setting, axis=0), np.max(per_setting, axis=0)
        steps = []
        for at, token in enumerate(greedy):
            top = np.argsort(-per_setting[0][at], kind="stable")[:TOP]
            steps.append(
                {
                    "bytes": model.piece(token),
                    "top_logprobs": [
                        {
                            "bytes": model.piece(int(t)),
                            "logprob": float(per_setting[0][at][t]),
                            "low": float(low[at][t]),
                            "high": float(high[at][t]),
                        }
                        for t in top
                    ],
                }
            )
        fixture["logprobs"].append({"prompt": prompt, "prompt_tokens": len(tokens), "steps": steps})
    prompt = chatml(MIN_P_PROMPT)
    kept = [set(m.min_p_kept(m.tokens(prompt), MIN_P)) for m in models.values()]
    fixture["min_p"] = {
        "prompt": prompt,
        "min_p": MIN_P,
        "kept_by_every_setting": [model.piece(t) for t in sorted(set.intersection(*kept))],
        "kept_by_any_setting": [model.piece(t) for t in sorted(set.union(*kept))],
    }
    print("settled tokens:", {k: [c.get("settled_tokens", len(c.get("steps", []))) for c in fixture[k]]
                              for k in ("chat", "penalties", "logprobs")})
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        json.dump(fixture, f, indent=1)
        f.write("\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
