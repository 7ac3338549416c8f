"""PyTorch reference for the Qwen3-0.6B-shaped random model (benches/qwen3_random.py): the
same texts, tokenised the same way (end-of-text appended, at most --max-seq-length tokens),
sorted by length and cut into batches of at most --max-batch-tokens padded tokens, run
through transformers' Qwen3Model in bf16 (SDPA attention), last-token pooling. Prints one
markdown row in embed-bench's columns.
Usage: python3 benches/qwen3_torch.py --model DIR --data FILE.jsonl [--limit N]"""
import argparse
import json
import time

import torch
from tokenizers import Tokenizer
from transformers import Qwen3Model

EOS = 151643


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--data", required=True)
    parser.add_argument("--limit", type=int, default=0)
    parser.add_argument("--max-seq-length", type=int, default=512)
    parser.add_argument("--max-batch-tokens", type=int, default=16384)
    parser.add_argument("--label", default="transformers Qwen3Model bf16, SDPA")
    args = parser.parse_args()
    texts = []
    with open(args.data, encoding="utf-8") as f:
        for line in f:
            texts.append(json.loads(line)["text"])
            if args.limit and len(texts) >= args.limit:
                break
    started = time.perf_counter()
    model = Qwen3Model.from_pretrained(args.model, torch_dtype=torch.bfloat16, attn_implementation="sdpa")
    model = model.cuda().eval()
    load_s = time.perf_counter() - started
    tokenizer = Tokenizer.from_file(f"{args.model}/tokenizer.json")
    tokenizer.no_truncation()
    tokenizer.no_padding()

    def batches(ids):
        order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))
        batch, longest = [], 0
        for i in order:
            grown = max(longest, len(ids[i]))
            if batch and (len(batch) + 1) * grown > args.max_batch_tokens:
                yield batch
                batch, longest = [], 0
            batch.append(i)
            longest = max(longest, len(ids[i]))
        if batch:
            yield batch

    def run(texts):
        ids = [e.ids[: args.max_seq_length - 1] + [EOS] for e in tokenizer.encode_batch(texts)]
        tokens = 0
        with torch.inference_mode():
            for batch in batches(ids):
                longest = max(len(ids[i]) for i in batch)
                rows = torch.full((len(batch), longest), EOS, dtype=torch.long)
                mask = torch.zeros((len(batch), longest), dtype=torch.long)
                for r, i in enumerate(batch):
                    rows[r, : len(ids[i])] = torch.tensor(ids[i])
                    mask[r, : len(ids[i])] = 1
                hidden = model(input_ids=rows.cuda(), attention_mask=mask.cuda()).last_hidden_state
                last = mask.sum(1).cuda() - 1
                pooled = torch.nn.functional.normalize(hidden[torch.arange(len(batch)).cuda(), last].float(), dim=-1)
                pooled.cpu()
                tokens += sum(len(ids[i]) for i in batch)
        torch.cuda.synchronize()
        return tokens

    run(texts[:256])  # warm-up
    started = time.perf_counter()
    tokens = run(texts)
    seconds = time.perf_counter() - started
    print(
        f"| {args.label}, torch {torch.__version__} | cuda bf16 | {len(texts)} | {seconds:.1f} | "
        f"{len(texts) / seconds:.1f} | {tokens / seconds:.0f} | - | - | {load_s:.2f} |",
        flush=True,
    )


if __name__ == "__main__":
    main()
