"""Overlap figures of generated answers (``metrics=``, ``--metric``) against the packages
everybody reports them with: Google's rouge-score (what Hugging Face's ``evaluate`` calls),
with and without its stemmer, SQuAD's token F1 and sacrebleu's BLEU and chrF, on what the
real SmolLM2 writes of real Wikipedia leads."""

from __future__ import annotations

import collections
import json
import math
import re
import string

import pytest
import sacrebleu
from rouge_score import rouge_scorer

import resident
from conftest import SMOLLM2, resident as run_resident, wiki_texts, write_corpus

ROUGE = ["rouge1", "rouge2", "rougeL", "rougeLsum"]


def squad_f1(gold: str, answer: str) -> float:
    """SQuAD's token F1, as its evaluation script defines it: lower-cased, no punctuation, no
    articles, whitespace-split words counted as bags; both empty is 1, one empty 0."""

    def words(text: str) -> list[str]:
        text = "".join(c for c in text.lower() if c not in set(string.punctuation))
        return re.sub(r"\b(a|an|the)\b", " ", text).split()

    gold_words, answer_words = words(gold), words(answer)
    if not gold_words or not answer_words:
        return float(gold_words == answer_words)
    shared = sum((collections.Counter(gold_words) & collections.Counter(answer_words)).values())
    if shared == 0:
        return 0.0
    precision, recall = shared / len(answer_words), shared / len(gold_words)
    return 2 * precision * recall / (precision + recall)


def summaries_corpus(tmp_path):
    """Wikipedia leads to summarise, each with its first sentence as the reference; one with
    a list of references (its first two sentences, and the two joined on two lines), one
    with none."""
    records = []
    for i, record in enumerate(wiki_texts(6)):
        text = record["text"][:1500]
        sentences = re.split(r"(?<=\.) ", text)
        if i == 1:
            record["highlights"] = [sentences[0], sentences[1], "\n".join(sentences[:2])]
        elif i != 5:
            record["highlights"] = sentences[0]
        records.append({**record, "text": text})
    return write_corpus(tmp_path / "leads.jsonl", records), records


def test_rouge_and_f1_are_rouge_score_s_and_squad_s_and_the_clis(local_cluster, tmp_path):
    corpus, records = summaries_corpus(tmp_path)
    prompt = "Summarise this article in one sentence:\n\n{text}"
    report = local_cluster.generate_job(
        str(corpus), str(SMOLLM2), str(tmp_path / "py"), prompt, max_new_tokens=48,
        reference_field="highlights", metrics="rouge,f1", progress=False,
    )
    run_resident(
        "generate", "--input", str(corpus), "--model", str(SMOLLM2), "--prompt", prompt,
        "--output", str(tmp_path / "cli"), "--max-new-tokens", "48",
        "--reference-field", "highlights", "--metric", "rouge", "--metric", "f1",
    )
    py, cli = (
        [json.loads(line) for line in open(tmp_path / name / "generations.jsonl")]
        for name in ("py", "cli")
    )
    assert py == cli
    scorer = rouge_scorer.RougeScorer(ROUGE)
    figures = collections.defaultdict(list)
    for line, record in zip(py, records):
        references = record.get("highlights")
        if references is None:
            assert not any(name in line for name in ROUGE + ["f1"]), line
            continue
        references = references if isinstance(references, list) else [references]
        expected = scorer.score_multi(references, line["text"])
        for name in ROUGE:
            assert line[name] == pytest.approx(expected[name].fmeasure, abs=1e-12), (name, line)
            figures[name].append(line[name])
        f1 = max(squad_f1(reference, line["text"]) for reference in references)
        assert line["f1"] == pytest.approx(f1, abs=1e-12), line
        figures["f1"].append(line["f1"])
    assert len(figures["f1"]) == 5
    assert any(0 < value < 1 for value in figures["rouge2"]), figures
    for name, values in figures.items():
        mean = sum(values) / len(values)
        spread = sum((v - mean) ** 2 for v in values) / (len(values) - 1)
        assert report[name] == pytest.approx(mean, abs=1e-12), name
        assert report[f"{name}_stderr"] == pytest.approx(math.sqrt(spread / len(values))), name
        assert report["overlap_sums"]["means"][name]["records"] == 5
    assert report["reference_records"] == 5
    # Stemmed (rouge-score's use_stemmer=True): the same generations, rouge-score's figures.
    local_cluster.generate_job(
        str(corpus), str(SMOLLM2), str(tmp_path / "stemmed"), prompt, max_new_tokens=48,
        reference_field="highlights", metrics=["rouge"], rouge_stemmer=True, progress=False,
    )
    stemmed = [json.loads(line) for line in open(tmp_path / "stemmed" / "generations.jsonl")]
    scorer = rouge_scorer.RougeScorer(ROUGE, use_stemmer=True)
    for line, plain, record in zip(stemmed, py, records):
        assert line["text"] == plain["text"] and "f1" not in line
        references = record.get("highlights")
        if references is not None:
            references = references if isinstance(references, list) else [references]
            expected = scorer.score_multi(references, line["text"])
            for name in ROUGE:
                assert line[name] == pytest.approx(expected[name].fmeasure, abs=1e-12), line


def test_bleu_and_chrf_are_sacrebleu_s_sentence_and_corpus_figures(local_cluster, tmp_path):
    """Each line's ``bleu`` and ``chrf`` are sacrebleu's ``sentence_bleu`` and
    ``sentence_chrf`` against all the record's references; the report's, ``corpus_bleu``
    and ``corpus_chrf`` over every record with references (a varying number of them), also
    when the records come in several chunks."""
    records = []
    for i, record in enumerate(wiki_texts(7)):
        sentence = re.split(r"(?<=\.) ", record["text"])[0][:300]
        references = [sentence, sentence.replace(" is ", " was ").replace(",", "")]
        records.append({"id": record["id"], "text": sentence, "refs": references[: 1 + i % 2]})
    del records[3]["refs"]
    corpus = write_corpus(tmp_path / "sentences.jsonl", records)
    report = local_cluster.generate_job(
        str(corpus), str(SMOLLM2), str(tmp_path / "out"), "Repeat this sentence exactly: {text}",
        max_new_tokens=64, reference_field="refs", metrics=["bleu", "chrf"], chunk_size=2,
        progress=False,
    )
    lines = [json.loads(line) for line in open(tmp_path / "out" / "generations.jsonl")]
    answers, streams = [], [[], []]
    for line, record in zip(lines, records):
        references = record.get("refs")
        if references is None:
            assert "bleu" not in line and "chrf" not in line, line
            continue
        bleu = sacrebleu.sentence_bleu(line["text"], references)
        chrf = sacrebleu.sentence_chrf(line["text"], references)
        assert line["bleu"] == pytest.approx(bleu.score, abs=1e-9), (line, bleu)
        assert line["chrf"] == pytest.approx(chrf.score, abs=1e-9), (line, chrf)
        answers.append(line["text"])
        for stream, reference in zip(streams, references + [None]):
            stream.append(reference)
    assert len(answers) == 6 and max(line.get("bleu", 0) for line in lines) > 10, lines
    assert report["bleu"] == pytest.approx(sacrebleu.corpus_bleu(answers, streams).score, abs=1e-9)
    assert report["chrf"] == pytest.approx(sacrebleu.corpus_chrf(answers, streams).score, abs=1e-9)
    assert "bleu_stderr" not in report and report["overlap_sums"]["bleu"]["records"] == 6
    assert report["chunks"]["total"] > 1, report["chunks"]


def test_overlap_arguments_that_cannot_work_are_refused_in_words(local_cluster, tmp_path):
    corpus = write_corpus(tmp_path / "one.jsonl", [{"id": 1, "text": "Hello.", "gold": "Hi."}])
    with pytest.raises(resident.BadInput, match="metrics scores .* give reference_field"):
        local_cluster.generate_job(
            str(corpus), str(SMOLLM2), str(tmp_path / "a"), "{text}", metrics=["f1"],
            progress=False,
        )
    with pytest.raises(resident.BadInput, match="rouge_stemmer=True stems the words ROUGE"):
        local_cluster.generate_job(
            str(corpus), str(SMOLLM2), str(tmp_path / "s"), "{text}", metrics="f1",
            reference_field="gold", rouge_stemmer=True, progress=False,
        )
    with pytest.raises(resident.BadInput, match='"meteor" is not an overlap metric: give rouge'):
        local_cluster.generate_job(
            str(corpus), str(SMOLLM2), str(tmp_path / "b"), "{text}", metrics=["meteor"],
            reference_field="gold", progress=False,
        )
