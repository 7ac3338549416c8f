"""transformers' `generate` as the GPU reference for `generate-bench` (issue 31), on a Hugging
Face checkpoint directory.

  random  fills a checkpoint of the exported shape (`generate-bench --export-hf DIR`: config,
          tokenizer, no weights) with random weights, saved as safetensors, for both engines
          to load when the real weights cannot travel to the GPU machine;
  time    greedy generation, batch B (left-padded, SDPA), on the same prompts as
          generate-bench (an article of news length in the chat template's user turn);
          prints a markdown row.

  python benches/generate_hf.py random --config .gpu-carry/smollm2-hf --out /tmp/smollm2-random
  python benches/generate_hf.py time --model /tmp/smollm2-random --data data/wiki_long.jsonl \
      --prompts 256 --batch 64 --max-new-tokens 128
"""

import argparse
import json
import shutil
import time
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer


def make_random(config_dir, out):
    torch.manual_seed(0)
    config = AutoConfig.from_pretrained(config_dir)
    model = AutoModelForCausalLM.from_config(config, torch_dtype=torch.bfloat16)
    out = Path(out)
    model.save_pretrained(out, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        if (Path(config_dir) / name).exists():
            shutil.copy(Path(config_dir) / name, out / name)
    print(f"random weights of {config_dir}'s shape in {out}")


def prompts(data, count, article_chars):
    texts = []
    with open(data) as f:
        for line in f:
            if len(texts) == count:
                break
            text = json.loads(line).get("text", "")[:article_chars]
            texts.append(f"Summarise this article in three sentences.\n\n{text}")
    return texts


def time_generate(args):
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(
        args.model, torch_dtype=torch.bfloat16, attn_implementation="sdpa"
    ).to("cuda")
    model.eval()
    chats = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True
        )
        for p in prompts(args.data, args.prompts, args.article_chars)
    ]
    # Warm-up: one small batch (CUDA context, kernels).
    warm = tokenizer(chats[:2], return_tensors="pt", padding=True, add_special_tokens=False)
    model.generate(**warm.to("cuda"), max_new_tokens=4, do_sample=False)
    torch.cuda.synchronize()
    generated = prompt_tokens = 0
    started = time.time()
    for at in range(0, len(chats), args.batch):
        batch = tokenizer(
            chats[at : at + args.batch], return_tensors="pt", padding=True, add_special_tokens=False
        ).to("cuda")
        with torch.inference_mode():
            out = model.generate(
                **batch, max_new_tokens=args.max_new_tokens, do_sample=False,
                pad_token_id=tokenizer.pad_token_id,
            )
        new = out[:, batch["input_ids"].shape[1] :]
        # Tokens up to and including each row's first end token.
        ended = new == tokenizer.eos_token_id
        lengths = torch.where(ended.any(1), ended.int().argmax(1) + 1, new.shape[1])
        generated += int(lengths.sum())
        prompt_tokens += int(batch["attention_mask"].sum())
    torch.cuda.synchronize()
    wall = time.time() - started
    print(
        f"| transformers generate bf16 SDPA, batch {args.batch} | {len(chats)} | {prompt_tokens} "
        f"| {generated} | {wall:.1f} | {generated / wall:.1f} |"
    )


def main():
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command", required=True)
    random = sub.add_parser("random")
    random.add_argument("--config", required=True)
    random.add_argument("--out", required=True)
    timing = sub.add_parser("time")
    timing.add_argument("--model", required=True)
    timing.add_argument("--data", required=True)
    timing.add_argument("--prompts", type=int, default=256)
    timing.add_argument("--batch", type=int, default=64)
    timing.add_argument("--max-new-tokens", type=int, default=128)
    timing.add_argument("--article-chars", type=int, default=2600)
    args = parser.parse_args()
    if args.command == "random":
        make_random(args.config, args.out)
    else:
        time_generate(args)


if __name__ == "__main__":
    main()
