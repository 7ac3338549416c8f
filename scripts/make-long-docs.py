"""Long documents for throughput runs: consecutive Wikipedia vital articles joined until each
document reaches --min-chars characters (default 2,400, about 500 tokens), so every document
fills the token limit of all-MiniLM-L6-v2 (256) and all-mpnet-base-v2 (384) and is truncated
there, as RedPajama, CNN/DailyMail or Wikipedia bodies would be.
Usage: python3 scripts/make-long-docs.py data/wiki_vital.jsonl data/wiki_long.jsonl"""
import argparse
import json
import os


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("source")
    parser.add_argument("out")
    parser.add_argument("--min-chars", type=int, default=2400)
    args = parser.parse_args()
    written, parts, length = 0, [], 0
    with open(args.source, encoding="utf-8") as src, open(args.out + ".partial", "w", encoding="utf-8") as out:
        for line in src:
            article = json.loads(line)
            parts.append(article)
            length += len(article["text"]) + 1
            if length >= args.min_chars:
                record = {
                    "id": "+".join(a["id"] for a in parts),
                    "title": parts[0]["title"],
                    "text": " ".join(a["text"] for a in parts),
                }
                out.write(json.dumps(record, ensure_ascii=False) + "\n")
                written += 1
                parts, length = [], 0
    os.rename(args.out + ".partial", args.out)
    print(f"wrote {written} long documents (>= {args.min_chars} characters) to {args.out}")


if __name__ == "__main__":
    main()
