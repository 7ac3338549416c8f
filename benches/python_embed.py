"""Embedding from Python (issue 32's benchmark): in one process, the time from `import
resident` to the first vector, then `cluster.embed` of the corpus against the same corpus
through `resident embed` (the CLI, in a subprocess) and through sentence-transformers'
`encode` (batch 32, the model's max_seq_length). Prints the CPU model and one table.

  .venv-st/bin/pip install ./python     # beside sentence-transformers and torch
  .venv-st/bin/python benches/python_embed.py [--limit N]
"""

import argparse
import json
import os
import subprocess
import tempfile
import time

started = time.perf_counter()
import resident  # noqa: E402  (timed from the start of the process)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="models/all-MiniLM-L6-v2")
    parser.add_argument("--data", default="data/wiki_vital.jsonl")
    parser.add_argument("--limit", type=int, default=0)
    parser.add_argument("--resident-bin", default="target/release/resident")
    args = parser.parse_args()

    cluster = resident.local()
    cluster.embed(["the first vector"], model=args.model, progress=False)
    first_vector = time.perf_counter() - started

    texts, records = [], []
    with open(args.data, encoding="utf-8") as f:
        for line in f:
            record = json.loads(line)
            texts.append(record["text"])
            records.append({"id": record["id"], "text": record["text"]})
            if args.limit and len(texts) >= args.limit:
                break
    rows = []

    began = time.perf_counter()
    vectors = cluster.embed(texts, model=args.model, progress=False)
    rows.append(("resident (Python) `cluster.embed`", time.perf_counter() - began))
    assert vectors.shape[0] == len(texts)

    with tempfile.TemporaryDirectory() as tmp:
        corpus = os.path.join(tmp, "corpus.jsonl")
        with open(corpus, "w") as f:
            for record in records:
                f.write(json.dumps(record) + "\n")
        began = time.perf_counter()
        subprocess.run(
            [args.resident_bin, "embed", "--input", corpus, "--model", args.model,
             "--output", os.path.join(tmp, "out")],
            check=True, capture_output=True,
        )
        rows.append(("`resident embed` (CLI, whole job)", time.perf_counter() - began))

    import torch  # noqa: PLC0415
    from sentence_transformers import SentenceTransformer  # noqa: PLC0415

    torch.set_num_threads(os.cpu_count() or 1)
    model = SentenceTransformer(args.model, device="cpu")
    began = time.perf_counter()
    model.encode(texts, batch_size=32, normalize_embeddings=True)
    rows.append(("sentence-transformers `encode`, batch 32", time.perf_counter() - began))

    cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    name = next((l.split(":", 1)[1].strip() for l in cpu.splitlines() if l.startswith("Model name")), "?")
    print(f"CPU: {name}, {os.cpu_count()} cores; {len(texts)} texts; "
          f"import resident to the first vector: {first_vector:.2f} s")
    print()
    print("| engine | texts | wall s | texts/s |")
    print("|---|---:|---:|---:|")
    for label, wall in rows:
        print(f"| {label} | {len(texts)} | {wall:.1f} | {len(texts) / wall:.1f} |")


if __name__ == "__main__":
    main()
