"""sentence-transformers reference for the embedding benchmark: same texts, same model,
batch 32, the model's own max_seq_length. Prints one markdown table row."""
import argparse
import json
import time

import torch
from sentence_transformers import SentenceTransformer


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="models/all-MiniLM-L6-v2")
    parser.add_argument("--data", default="data/wiki_vital.jsonl")
    parser.add_argument("--limit", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--fp16", action="store_true")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--vectors-out", help="write the vectors as little-endian f32 rows")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    texts = []
    with open(args.data, encoding="utf-8") as f:
        for line in f:
            texts.append(json.loads(line)["text"])
            if args.limit and len(texts) >= args.limit:
                break
    started = time.perf_counter()
    model = SentenceTransformer(args.model, device=args.device)
    if args.fp16:
        model = model.half()
    load_s = time.perf_counter() - started
    model.encode(texts[:64], batch_size=args.batch_size)  # warm-up
    started = time.perf_counter()
    vectors = model.encode(texts, batch_size=args.batch_size, convert_to_numpy=True)
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    if args.vectors_out:
        vectors.astype("<f4").tofile(args.vectors_out)
    tokens = sum(min(len(ids), model.max_seq_length) for ids in model.tokenizer(texts)["input_ids"])
    dtype = "f16" if args.fp16 else "f32"
    print(
        f"| sentence-transformers {__import__('sentence_transformers').__version__}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} thread(s), batch {args.batch_size} | {args.device} {dtype} | {len(vectors)} | {seconds:.1f} | "
        f"{len(vectors) / seconds:.1f} | {tokens / seconds:.0f} | - | - | {load_s:.2f} |",
        flush=True,
    )


if __name__ == "__main__":
    main()
