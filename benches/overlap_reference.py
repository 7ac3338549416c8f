"""The reference side of benches/overlap-bench.sh: rouge-score 0.1.2 (with and without its
stemmer) and sacrebleu 2.6 (sentence BLEU and chrF) on the same pairs, timed figure by
figure, and the largest difference from our figures (OURS, overlap-bench's output).
Usage: python overlap_reference.py PAIRS OURS CPU"""

import json
import sys
import time

import sacrebleu
from rouge_score import rouge_scorer

ROUGE = ["rouge1", "rouge2", "rougeL", "rougeLsum"]


def main() -> None:
    pairs_path, ours_path, cpu = sys.argv[1:4]
    pairs = [json.loads(line) for line in open(pairs_path)]
    ours = [json.loads(line) for line in open(ours_path)]
    runs = [
        ("rouge (four figures)", "", lambda: rouge_scorer.RougeScorer(ROUGE)),
        ("rouge --rouge-stemmer", "_stemmed",
         lambda: rouge_scorer.RougeScorer(ROUGE, use_stemmer=True)),
    ]
    print(f"| figure (reference, {cpu}) | pairs | µs a pair | largest difference from ours |")
    print("|---|---:|---:|---:|")
    for name, suffix, make in runs:
        scorer = make()
        started = time.perf_counter()
        scored = [scorer.score_multi(p["references"], p["answer"]) for p in pairs]
        seconds = time.perf_counter() - started
        worst = max(abs(s[k].fmeasure - o[k + suffix]) for s, o in zip(scored, ours) for k in ROUGE)
        print(f"| rouge-score: {name} | {len(pairs)} | {seconds * 1e6 / len(pairs):.1f} | {worst:.2g} |")
    for name, score in [("bleu", sacrebleu.sentence_bleu), ("chrf", sacrebleu.sentence_chrf)]:
        started = time.perf_counter()
        scored = [score(p["answer"], p["references"]).score for p in pairs]
        seconds = time.perf_counter() - started
        worst = max(abs(s - o[name]) for s, o in zip(scored, ours))
        print(f"| sacrebleu: sentence_{name} | {len(pairs)} | {seconds * 1e6 / len(pairs):.1f} | {worst:.2g} |")


if __name__ == "__main__":
    main()
