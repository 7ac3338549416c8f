"""Scoring text from Python (`cluster.generate(..., score=True)`), as `resident generate
--score` does, with the real SmolLM2 GGUF: a text's score is the CLI's for the same text;
a context before the text is left unscored, so multiple-choice answers compare as
lm-evaluation-harness compares them; a conversation's reply is scored as DPO reads it;
wrong arguments are refused in words."""

from __future__ import annotations

import json
import math
import re

import pytest

import resident
from conftest import SMOLLM2, resident as run_resident, wiki_texts, write_corpus


def test_a_score_is_the_clis_and_real_text_beats_its_words_reversed(local_cluster, tmp_path):
    texts = [r["text"] for r in wiki_texts(4)]
    reversed_texts = [" ".join(reversed(t.split(" "))) for t in texts]
    outs = local_cluster.generate(
        texts + reversed_texts, model=str(SMOLLM2), template="none", max_new_tokens=0,
        score=True, prompt_logprobs=1, progress=False,
    )
    for real, backwards in zip(outs[:4], outs[4:]):
        assert real["tokens"] == 0 and real["text"] == ""
        assert real["score"]["perplexity"] < backwards["score"]["perplexity"], (real, backwards)
        listed = real["prompt_logprobs"]
        assert len(listed) == real["score"]["tokens"] == real["prompt_tokens"] - 1
        assert all(len(t["top_logprobs"]) == 1 for t in listed)
        assert abs(sum(t["logprob"] for t in listed) - real["score"]["logprob"]) < 1e-3

    # The CLI, in its own process, scores the same texts alike.
    corpus = write_corpus(tmp_path / "in.jsonl", [{"id": i, "text": t} for i, t in enumerate(texts)])
    run_resident(
        "generate", "--input", str(corpus), "--model", str(SMOLLM2), "--output",
        str(tmp_path / "out"), "--score", "--max-new-tokens", "0", "--template", "none",
    )
    lines = [json.loads(l) for l in open(tmp_path / "out" / "generations.jsonl")]
    for line, out, text in zip(lines, outs, texts):
        assert line["score"]["tokens"] == out["score"]["tokens"]
        assert abs(line["score"]["logprob"] - out["score"]["logprob"]) < 1e-3 * abs(
            out["score"]["logprob"]
        )
        # Its first token has nothing before it: not every token is scored, no size.
        assert "bytes" not in out["score"] and "bytes" not in line["score"]

    # score_first_token scores each text from its first token, after the start token: its
    # size as lm-evaluation-harness counts it, and the bits per byte it gives.
    first = local_cluster.generate(
        texts, model=str(SMOLLM2), template="none", max_new_tokens=0, score=True,
        score_first_token=True, prompt_logprobs=0, progress=False,
    )
    for out, alone, text in zip(first, outs, texts):
        assert out["score"]["tokens"] == alone["score"]["tokens"] + 1
        assert bytes(b for t in out["prompt_logprobs"] for b in t["bytes"]) == text.encode()
        size = (out["score"]["bytes"], out["score"]["words"])
        assert size == (len(text.encode()), len(re.split(r"\s+", text)))
        bits = -out["score"]["logprob"] / len(text.encode()) / math.log(2)
        assert abs(out["score"]["bits_per_byte"] - bits) < 1e-9


def test_a_context_is_left_unscored_and_the_right_answer_scores_highest(local_cluster):
    context = "Question: What is the capital of France?\nAnswer: The capital of France is"
    choices = [" Paris.", " a banana.", " Tuesday."]
    outs = local_cluster.generate(
        [{"prompt": choice, "context": context} for choice in choices], model=str(SMOLLM2),
        template="none", max_new_tokens=0, score=True, prompt_logprobs=0, progress=False,
    )
    for choice, out in zip(choices, outs):
        listed = "".join(t["token"] for t in out["prompt_logprobs"])
        assert listed == choice, (listed, choice)
    best = max(range(len(choices)), key=lambda i: outs[i]["score"]["logprob"])
    assert choices[best] == " Paris.", [o["score"] for o in outs]
    assert outs[0]["score"]["greedy"] is True, outs[0]["score"]


def test_a_system_message_under_template_none_is_text_before_the_prompt(local_cluster):
    """``system=`` with ``template="none"`` is text directly before each prompt
    (lm-evaluation-harness's system instruction without its chat template): generated and
    scored as the same text written before the prompt by hand."""
    system, question = "Answer in one word.\n", "Q: What is the capital of France?\nA:"
    raw = dict(model=str(SMOLLM2), template="none", progress=False)
    said, by_hand = (
        local_cluster.generate(prompts, max_new_tokens=8, **raw, **extra)
        for prompts, extra in (([question], {"system": system}), ([system + question], {}))
    )
    assert said[0]["text"] == by_hand[0]["text"], (said, by_hand)
    assert said[0]["prompt_tokens"] == by_hand[0]["prompt_tokens"], (said, by_hand)
    scored, scored_by_hand = (
        local_cluster.generate([{"prompt": " Paris", "context": context}], max_new_tokens=0,
                               score=True, **raw, **extra)
        for context, extra in ((question, {"system": system}), (system + question, {}))
    )
    assert scored[0]["score"]["tokens"] == scored_by_hand[0]["score"]["tokens"] >= 1
    assert abs(scored[0]["score"]["logprob"] - scored_by_hand[0]["score"]["logprob"]) < 1e-3


def test_choices_as_contexts_score_the_prompt_after_each_choice(local_cluster):
    """Winogrande's layout: the prompt is scored after each choice, as a prompt scored
    after that choice as its context is."""
    head = "The trophy does not fit in the suitcase because the"
    contexts = [f"{head} suitcase", f"{head} trophy"]
    ending = " is too large."
    out = local_cluster.generate(
        [{"prompt": ending, "choices": contexts, "answer": 1}], model=str(SMOLLM2),
        template="none", max_new_tokens=0, score=True, choices_as_contexts=True,
        progress=False,
    )[0]
    alone = local_cluster.generate(
        [{"prompt": ending, "context": c} for c in contexts], model=str(SMOLLM2),
        template="none", max_new_tokens=0, score=True, progress=False,
    )
    for scored, by_hand in zip(out["choice_scores"], alone):
        assert scored["tokens"] == by_hand["score"]["tokens"]
        assert abs(scored["logprob"] - by_hand["score"]["logprob"]) < 1e-3, (scored, by_hand)
    assert out["answer"] == 1 and out["correct"] == (out["best"] == 1)


def test_winogrande_s_hub_rows_score_as_the_same_rows_split_by_hand(local_cluster, tmp_path):
    """``blank``, comma-separated ``choices_field`` and ``answer_base`` read Winogrande's
    rows as the hub writes them, as ``--blank`` does."""
    head = "The trophy does not fit in the suitcase because the"
    hub = write_corpus(tmp_path / "hub.jsonl", [
        {"id": "w1", "sentence": f"{head} _ is too large.", "option1": "trophy",
         "option2": "suitcase", "answer": "1"},
    ])
    split = write_corpus(tmp_path / "split.jsonl", [
        {"id": "w1", "text": "is too large.", "choices": [f"{head} trophy", f"{head} suitcase"],
         "answer": 0},
    ])
    scoring = dict(template="none", max_new_tokens=0, score=True, choices_as_contexts=True,
                   target_delimiter=" ", progress=False)
    local_cluster.generate_job(
        str(hub), str(SMOLLM2), str(tmp_path / "hub"), "{text}", text_field="sentence",
        choices_field="option1,option2", answer_base=1, blank="_", **scoring,
    )
    local_cluster.generate_job(str(split), str(SMOLLM2), str(tmp_path / "split"), "{text}",
                               **scoring)
    (hub_line,), (split_line,) = (
        [json.loads(l) for l in open(tmp_path / name / "generations.jsonl")]
        for name in ("hub", "split")
    )
    assert hub_line["answer"] == split_line["answer"] == 0, (hub_line, split_line)
    for ours, by_hand in zip(hub_line["choice_scores"], split_line["choice_scores"]):
        assert ours["tokens"] == by_hand["tokens"] > 0
        assert abs(ours["logprob"] - by_hand["logprob"]) < 1e-3, (ours, by_hand)
    with pytest.raises(resident.BadInput, match="needs choices as contexts"):
        local_cluster.generate_job(
            str(hub), str(SMOLLM2), str(tmp_path / "refused"), "{text}", template="none",
            max_new_tokens=0, score=True, blank="_", progress=False,
        )


def test_a_chat_score_ranks_replies_as_dpo_reads_them(local_cluster):
    question = {"role": "user", "content": "What is the capital of France?"}
    replies = ["The capital of France is Paris.", "The capital of France is Berlin."]
    outs = local_cluster.chat(
        [[question, {"role": "assistant", "content": r}] for r in replies] + [[question]],
        model=str(SMOLLM2), max_new_tokens=0, score=True, prompt_logprobs=0, progress=False,
    )
    chosen, rejected, open_ended = outs
    for reply, out in zip(replies, outs):
        listed = "".join(t["token"] for t in out["prompt_logprobs"])
        assert listed == reply + "<|im_end|>", (listed, reply)
    assert chosen["score"]["logprob"] > rejected["score"]["logprob"] + 1.0, (chosen, rejected)
    assert "ends with a user message" in open_ended["error"], open_ended


def test_choices_score_as_contexts_do_and_a_preference_job_reports_its_accuracy(
    local_cluster, tmp_path
):
    context = "Question: What is the capital of France?\nAnswer: The capital of France is"
    choices = [" Paris.", " a banana.", " Tuesday."]
    (asked,) = local_cluster.generate(
        [{"prompt": context, "choices": choices, "answer": 0}], model=str(SMOLLM2),
        template="none", max_new_tokens=0, score=True, progress=False,
    )
    apart = local_cluster.generate(
        [{"prompt": choice, "context": context} for choice in choices], model=str(SMOLLM2),
        template="none", max_new_tokens=0, score=True, progress=False,
    )
    assert asked["tokens"] == 0 and asked["text"] == ""
    for scored, alone in zip(asked["choice_scores"], apart):
        assert scored["tokens"] == alone["score"]["tokens"]
        assert abs(scored["logprob"] - alone["score"]["logprob"]) < 1e-3, (scored, alone)
    assert (asked["best"], asked["answer"], asked["correct"]) == (0, 0, True), asked
    weights = [math.exp(s["logprob"]) for s in asked["choice_scores"]]
    assert abs(asked["answer_probability"] - weights[0] / sum(weights)) < 1e-9, asked
    # lm-evaluation-harness's brier_score of the record: softmax against the one-hot answer.
    shares = [w / sum(weights) for w in weights]
    brier = sum((p - (i == 0)) ** 2 for i, p in enumerate(shares))
    assert abs(asked["brier_score"] - brier) < 1e-9, (asked, brier)
    # Several right answers (TruthfulQA's MC2): their share of the choices' probability.
    (several,) = local_cluster.generate(
        [{"prompt": context, "choices": choices, "answer": [" Tuesday.", 0]}],
        model=str(SMOLLM2), template="none", max_new_tokens=0, score=True, progress=False,
    )
    assert "answer" not in several and several["answers"] == [0, 2], several
    right = (weights[0] + weights[2]) / sum(weights)
    assert abs(several["answer_probability"] - right) < 1e-6, (several, right)
    assert "brier_score" not in several, "no one-hot answer for several right ones"
    assert several["correct"] is True

    question = {"role": "user", "content": "Is the sun a star?"}
    (pair,) = local_cluster.chat(
        [{"messages": [question], "choices": ["Yes, it is a star.", "No, it is a planet."],
          "answer": 0}],
        model=str(SMOLLM2), max_new_tokens=0, score=True, progress=False,
    )
    assert len(pair["choice_scores"]) == 2 and pair["answer"] == 0, pair

    # A job over TRL's preference pairs: the chosen reply first, the accuracy reported.
    pairs = [
        {"id": 1, "prompt": "Water boils at", "chosen": " 100 degrees Celsius.",
         "rejected": " 40 degrees Celsius."},
        {"id": 2, "prompt": [question], "chosen": [{"role": "assistant", "content": "Yes."}],
         "rejected": [{"role": "assistant", "content": "No, it is a planet."}]},
    ]
    corpus = write_corpus(tmp_path / "pairs.jsonl", pairs)
    report = local_cluster.generate_job(
        str(corpus), str(SMOLLM2), str(tmp_path / "pairs"), "{text}", template="none",
        max_new_tokens=0, score=True, progress=False,
    )
    lines = [json.loads(l) for l in open(tmp_path / "pairs" / "generations.jsonl")]
    correct = sum(line["correct"] for line in lines)
    assert report["answered_records"] == 2, report
    assert report["accuracy"] == correct / 2, (report, lines)


def assert_fewshot_as_written(cluster, corpus, tmp_path, by_hand, fields, **fewshot):
    """The job with ``fewshot`` gives the lines the examples written into the prompt give."""
    cluster.generate_job(
        str(corpus), str(SMOLLM2), str(tmp_path / "shot"), "Q: {text}\nA:", **fewshot, **fields
    )
    cluster.generate_job(str(corpus), str(SMOLLM2), str(tmp_path / "hand"), by_hand, **fields)
    shot, hand = (open(tmp_path / name / "generations.jsonl").read() for name in ("shot", "hand"))
    assert shot == hand and '"choice_scores"' in shot, shot


def test_a_fewshot_job_scores_as_its_examples_written_into_the_prompt(local_cluster, tmp_path):
    # HellaSwag's field names; the dev file's first two answered records as examples.
    dev = write_corpus(tmp_path / "dev.jsonl", [
        {"id": "d0", "text": "Snow is", "endings": [" white", " black"]},
        {"id": "d1", "text": "Grass is", "endings": [" blue", " green"], "label": "1"},
        {"id": "d2", "text": "Fire is", "endings": [" hot", " cold"], "label": "0"},
    ])
    corpus = write_corpus(tmp_path / "test.jsonl", [
        {"id": "sky", "text": "The sky is", "endings": [" blue", " green"], "label": "0"},
    ])
    fields = dict(template="none", max_new_tokens=0, score=True, progress=False,
                  choices_field="endings", answer_field="label")
    by_hand = "Q: Grass is\nA: green\n\nQ: Fire is\nA: hot\n\nQ: {text}\nA:"
    assert_fewshot_as_written(
        local_cluster, corpus, tmp_path, by_hand, fields, fewshot_input=str(dev), fewshot=2
    )
    # gen_prefix starts each example's answer (a space after it) and the record's.
    by_hand = "Q: Grass is\nA:So:  green\n\nQ: Fire is\nA:So:  hot\n\nQ: {text}\nA:So:"
    assert_fewshot_as_written(
        local_cluster, corpus, tmp_path / "prefixed", by_hand, fields, fewshot_input=str(dev),
        fewshot=2, gen_prefix="So:",
    )
    with pytest.raises(resident.BadInput, match="needs score=True"):
        local_cluster.generate_job(
            str(corpus), str(SMOLLM2), str(tmp_path / "refused"), "{text}", template="none",
            fewshot_input=str(dev), progress=False,
        )


def test_grouped_fewshot_gives_each_record_its_own_subject_s_examples(local_cluster, tmp_path):
    dev = write_corpus(tmp_path / "dev.jsonl", [
        {"subject": "heat", "text": "Fire is", "choices": [" hot", " cold"], "answer": 0},
        {"subject": "colour", "text": "Grass is", "choices": [" blue", " green"], "answer": 1},
    ])
    corpus = write_corpus(tmp_path / "test.jsonl", [
        {"id": "sky", "subject": "colour", "text": "The sky is", "choices": [" blue", " red"],
         "answer": 0},
    ])
    fields = dict(template="none", max_new_tokens=0, score=True, progress=False)
    # The description, then the colour example only, though the heat example comes first
    # in the file.
    by_hand = "About colour:\nQ: Grass is\nA: green\n\nQ: {text}\nA:"
    assert_fewshot_as_written(
        local_cluster, corpus, tmp_path, by_hand, fields, fewshot_input=str(dev), fewshot=1,
        fewshot_group="subject", description="About {subject}:\n",
    )
    # Drawn per record (fewshot_seed) from a group of one: that one example.
    (tmp_path / "seeded").mkdir()
    assert_fewshot_as_written(
        local_cluster, corpus, tmp_path / "seeded", by_hand, fields, fewshot_input=str(dev),
        fewshot=1, fewshot_group="subject", description="About {subject}:\n", fewshot_seed=3,
    )
    report = local_cluster.generate_job(
        str(corpus), str(SMOLLM2), str(tmp_path / "by"), "{text}", accuracy_by="subject", **fields
    )
    line = json.loads(open(tmp_path / "by" / "generations.jsonl").read())
    colour = report["accuracy_by_group"]["groups"]["colour"]
    assert colour["answered_records"] == 1 and colour["accuracy"] == float(line["correct"]), report
    with pytest.raises(resident.BadInput, match="accuracy_by breaks down .* needs score=True"):
        local_cluster.generate_job(
            str(corpus), str(SMOLLM2), str(tmp_path / "refused"), "{text}", template="none",
            accuracy_by="subject", progress=False,
        )
    for refused in (dict(fewshot_group="subject"), dict(fewshot_sampler="lm-eval"),
                    dict(fewshot_answer_field="cot")):
        with pytest.raises(resident.BadInput, match="fewshot_sampler and fewshot_answer_field pick"):
            local_cluster.generate_job(
                str(corpus), str(SMOLLM2), str(tmp_path / "refused"), "{text}", **refused,
                **fields,
            )


def test_fewshot_as_multiturn_scores_as_the_conversation_it_makes(local_cluster, tmp_path):
    """``fewshot_as_multiturn=True`` under the chat template: the description the system
    message, each example a user turn and its answer the assistant's, then the record's
    prompt: the lines the same conversations give as records; refused without the chat
    template."""
    dev = write_corpus(tmp_path / "dev.jsonl", [
        {"id": "d0", "text": "Fire is", "choices": ["hot", "cold"], "answer": 0},
        {"id": "d1", "text": "Grass is", "choices": ["blue", "green"], "answer": 1},
    ])
    question = {"id": "sky", "text": "The sky is", "choices": ["blue", "red"], "answer": 0}
    corpus = write_corpus(tmp_path / "test.jsonl", [question])
    fields = dict(template="chat", max_new_tokens=0, score=True, progress=False)
    local_cluster.generate_job(
        str(corpus), str(SMOLLM2), str(tmp_path / "turns"), "Q: {text}\nA:",
        fewshot_input=str(dev), fewshot=2, fewshot_as_multiturn=True,
        description="Say one word.", **fields,
    )
    said = [("system", "Say one word."), ("user", "Q: Fire is\nA:"), ("assistant", "hot"),
            ("user", "Q: Grass is\nA:"), ("assistant", "green"), ("user", "Q: The sky is\nA:")]
    written = dict(question, messages=[{"role": r, "content": c} for r, c in said])
    del written["text"]
    conversation = write_corpus(tmp_path / "conversation.jsonl", [written])
    local_cluster.generate_job(
        str(conversation), str(SMOLLM2), str(tmp_path / "hand"), "{text}", **fields
    )
    turns, hand = (open(tmp_path / name / "generations.jsonl").read() for name in ("turns", "hand"))
    assert turns == hand and '"choice_scores"' in turns, (turns, hand)
    with pytest.raises(resident.BadInput, match="fewshot_as_multiturn .* needs the chat template"):
        local_cluster.generate_job(
            str(corpus), str(SMOLLM2), str(tmp_path / "refused"), "{text}",
            fewshot_input=str(dev), fewshot=1, fewshot_as_multiturn=True,
            **dict(fields, template="none"),
        )


def test_lm_eval_s_sampler_draws_what_python_s_own_random_draws(local_cluster, tmp_path):
    """``fewshot_sampler="lm-eval"``: each record's examples are what
    ``random.Random(1234).sample(examples, n)`` gives, record after record, as
    lm-evaluation-harness draws them: each line equals the record run with those examples
    written into its prompt by hand."""
    import random

    shots = [
        {"id": f"t{i}", "text": f"{i} plus one is", "choices": [f" {i + 1}", f" {i + 5}"], "answer": 0}
        for i in range(12)
    ]
    train = write_corpus(tmp_path / "train.jsonl", shots)
    records = [
        {"id": f"r{i}", "text": f"{20 + i} plus one is", "choices": [f" {21 + i}", " 3"], "answer": 0}
        for i in range(3)
    ]
    corpus = write_corpus(tmp_path / "test.jsonl", records)
    fields = dict(template="none", max_new_tokens=0, score=True, progress=False)
    prompt = "Q: {text}\nA:"
    local_cluster.generate_job(
        str(corpus), str(SMOLLM2), str(tmp_path / "drawn"), prompt, fewshot_input=str(train),
        fewshot=2, fewshot_sampler="lm-eval", **fields,
    )
    drawn = [json.loads(line) for line in open(tmp_path / "drawn" / "generations.jsonl")]
    stream = random.Random(1234)
    for record, line in zip(records, drawn):
        examples = "".join(
            f"Q: {shots[j]['text']}\nA:{shots[j]['choices'][0]}\n\n"
            for j in stream.sample(range(len(shots)), 2)
        )
        one = write_corpus(tmp_path / f"{record['id']}.jsonl", [record])
        local_cluster.generate_job(
            str(one), str(SMOLLM2), str(tmp_path / f"hand-{record['id']}"), examples + prompt,
            **fields,
        )
        hand = json.loads(open(tmp_path / f"hand-{record['id']}" / "generations.jsonl").read())
        assert line == hand, (line, hand, examples)
    with pytest.raises(resident.BadInput, match="no few-shot sampler: give per-record"):
        local_cluster.generate_job(
            str(corpus), str(SMOLLM2), str(tmp_path / "refused"), prompt, fewshot_input=str(train),
            fewshot=2, fewshot_sampler="random", **fields,
        )


def test_choice_labels_score_letters_after_the_choices_written_into_the_prompt(
    local_cluster, tmp_path
):
    corpus = write_corpus(tmp_path / "test.jsonl", [
        {"id": "sky", "text": "The sky is", "choices": ["green", "blue"], "answer": 1},
    ])
    fields = dict(template="none", max_new_tokens=0, score=True, progress=False)
    local_cluster.generate_job(
        str(corpus), str(SMOLLM2), str(tmp_path / "letters"),
        "{text}\nA. {choices.0}\nB. {choices.1}\nAnswer: ", choice_labels=["A", "B"], **fields,
    )
    by_hand = write_corpus(tmp_path / "hand.jsonl", [
        {"id": "sky", "text": "The sky is", "choices": ["A", "B"], "answer": 1},
    ])
    local_cluster.generate_job(
        str(by_hand), str(SMOLLM2), str(tmp_path / "hand"),
        "{text}\nA. green\nB. blue\nAnswer: ", **fields,
    )
    letters, hand = (
        open(tmp_path / name / "generations.jsonl").read() for name in ("letters", "hand")
    )
    assert letters == hand and '"choice_scores"' in letters, letters
    with pytest.raises(resident.BadInput, match="choice_labels scores labels .* needs score=True"):
        local_cluster.generate_job(
            str(corpus), str(SMOLLM2), str(tmp_path / "refused"), "{text}", template="none",
            choice_labels=["A", "B"], progress=False,
        )


def test_a_fewshot_answer_field_writes_each_example_s_own_answer(local_cluster, tmp_path):
    """``fewshot_answer_field`` answers each example with its own field, not the reference
    field records are checked against (an example without it is passed over), as the same
    examples written into the prompt by hand, and as the CLI's ``--fewshot-answer-field``."""
    dev = write_corpus(tmp_path / "dev.jsonl", [
        {"id": "d1", "text": "What is 2 + 2?", "cot": "2 + 2 = 4. The answer is 4.", "answer": "4"},
        {"id": "d2", "text": "No worked answer.", "answer": "1"},
        {"id": "d3", "text": "What is 3 * 2?", "cot": "3 * 2 = 6. The answer is 6.", "answer": "6"},
    ])
    corpus = write_corpus(tmp_path / "qa.jsonl", [{"id": 1, "text": "What is 5 + 1?", "answer": "6"}])
    common = dict(template="none", max_new_tokens=12, reference_field="answer", progress=False)
    local_cluster.generate_job(
        str(corpus), str(SMOLLM2), str(tmp_path / "py"), "Q: {text}\nA:", fewshot_input=str(dev),
        fewshot=2, target_delimiter=" ", fewshot_answer_field="cot", **common,
    )
    by_hand = ("Q: What is 2 + 2?\nA: 2 + 2 = 4. The answer is 4.\n\n"
               "Q: What is 3 * 2?\nA: 3 * 2 = 6. The answer is 6.\n\nQ: {text}\nA:")
    local_cluster.generate_job(str(corpus), str(SMOLLM2), str(tmp_path / "hand"), by_hand, **common)
    run_resident(
        "generate", "--input", str(corpus), "--model", str(SMOLLM2), "--prompt", "Q: {text}\nA:",
        "--output", str(tmp_path / "cli"), "--template", "none", "--max-new-tokens", "12",
        "--reference-field", "answer", "--fewshot-input", str(dev), "--fewshot", "2",
        "--target-delimiter", " ", "--fewshot-answer-field", "cot",
    )
    py, hand, cli = (
        [json.loads(line) for line in open(tmp_path / name / "generations.jsonl")]
        for name in ("py", "hand", "cli")
    )
    assert py == hand == cli, (py, hand, cli)
    assert py[0]["prompt_tokens"] > 30, py


def test_generated_answers_are_checked_as_the_clis_and_refusals_say_what_to_do(
    local_cluster, tmp_path
):
    questions = ["What is the capital of France?", "How many legs does a spider have?"]
    corpus = write_corpus(tmp_path / "qa.jsonl", [
        {"id": i, "text": q, "gold": {"aliases": ["Paris", "8", "eight"]}, "task": f"t{i}"}
        for i, q in enumerate(questions)
    ])
    checks = dict(
        reference_field="gold.aliases", extract=r"([A-Za-z0-9]+)", extract_match="last",
        ignore_regex=[r"\."], ignore_case=True, accuracy_by="task",
    )
    report = local_cluster.generate_job(
        str(corpus), str(SMOLLM2), str(tmp_path / "py"), "{text}", max_new_tokens=12,
        progress=False, **checks,
    )
    run_resident(
        "generate", "--input", str(corpus), "--model", str(SMOLLM2), "--prompt", "{text}",
        "--output", str(tmp_path / "cli"), "--max-new-tokens", "12",
        "--reference-field", "gold.aliases", "--extract", "([A-Za-z0-9]+)",
        "--extract-match", "last", "--ignore-regex", r"\.", "--ignore-case",
        "--accuracy-by", "task",
    )
    py, cli = (
        [json.loads(line) for line in open(tmp_path / name / "generations.jsonl")]
        for name in ("py", "cli")
    )
    for line in py + cli:
        words = re.findall(r"[A-Za-z0-9]+", line["text"])
        assert line["extracted"] == (words[-1] if words else None), line
        answer = (words[-1].rstrip(".").lower() if words else None)
        assert line["correct"] == (answer in ("paris", "8", "eight")), line
    right = sum(line["correct"] for line in py)
    assert report["reference_records"] == 2 and report["exact_match"] == right / 2, report
    assert set(report["accuracy_by_group"]["groups"]) == {"t0", "t1"}
    # Named filters judge the same generation, each as its own extract would.
    del checks["extract"], checks["extract_match"]
    named = local_cluster.generate_job(
        str(corpus), str(SMOLLM2), str(tmp_path / "named"), "{text}", max_new_tokens=12,
        progress=False, filters=["first=([A-Za-z0-9]+)", "last:last=([A-Za-z0-9]+)"],
        **checks,
    )
    for line, alone in zip(open(tmp_path / "named" / "generations.jsonl"), py):
        line = json.loads(line)
        words = re.findall(r"[A-Za-z0-9]+", line["text"])
        assert line["extracted"] == line["filters"]["first"]["extracted"] == (
            words[0] if words else None
        ), line
        assert line["filters"]["last"] == {
            key: alone[key] for key in ("extracted", "correct")
        }, (line, alone)
    assert named["filters"]["last"]["exact_match"] == report["exact_match"], named
    p = report["exact_match"]
    assert report["exact_match_stderr"] == pytest.approx((p * (1 - p) / 1) ** 0.5), report
    assert named["filters"]["last"]["exact_match_stderr"] == report["exact_match_stderr"]
    with pytest.raises(resident.BadInput, match="extract and filters both say"):
        local_cluster.generate_job(
            str(corpus), str(SMOLLM2), str(tmp_path / "refused"), "{text}", extract="x",
            filters=["a=y"], progress=False,
        )
    with pytest.raises(resident.BadInput, match="filters is a list"):
        local_cluster.generate_job(
            str(corpus), str(SMOLLM2), str(tmp_path / "refused"), "{text}", filters="a=y",
            progress=False,
        )
    # A generating job's few-shot examples are answered by their reference field.
    dev = write_corpus(tmp_path / "dev.jsonl", [
        {"id": "d", "text": "What is 1 plus 1?", "gold": {"aliases": ["2", "two"]}},
    ])
    answers = dict(reference_field="gold.aliases", max_new_tokens=8, template="none",
                   progress=False)
    local_cluster.generate_job(
        str(corpus), str(SMOLLM2), str(tmp_path / "shots"), "Q: {text}\nA:",
        fewshot_input=str(dev), fewshot=1, target_delimiter=" ", **answers,
    )
    local_cluster.generate_job(
        str(corpus), str(SMOLLM2), str(tmp_path / "written"),
        "Q: What is 1 plus 1?\nA: 2\n\nQ: {text}\nA:", **answers,
    )
    shots, written = (
        open(tmp_path / name / "generations.jsonl").read() for name in ("shots", "written")
    )
    assert shots == written and '"correct"' in shots, shots
    with pytest.raises(resident.BadInput, match="fewshot_input puts answered examples"):
        local_cluster.generate_job(
            str(corpus), str(SMOLLM2), str(tmp_path / "refused"), "{text}",
            fewshot_input=str(dev), progress=False,
        )
    with pytest.raises(resident.BadInput, match="ignore_case .* give reference_field"):
        local_cluster.generate_job(
            str(corpus), str(SMOLLM2), str(tmp_path / "refused"), "{text}", ignore_case=True,
            progress=False,
        )
    with pytest.raises(resident.BadInput, match="extract_match picks"):
        local_cluster.generate_job(
            str(corpus), str(SMOLLM2), str(tmp_path / "refused"), "{text}",
            extract_match="last", progress=False,
        )
    with pytest.raises(resident.BadInput, match="not a regular expression"):
        local_cluster.generate_job(
            str(corpus), str(SMOLLM2), str(tmp_path / "refused"), "{text}", extract="(",
            progress=False,
        )


def test_choices_as_contexts_under_the_chat_template_are_user_turns(local_cluster):
    """Under the chat template each context is the user's turn and the prompt is scored as
    the reply's start (lm-evaluation-harness's Winogrande with --apply_chat_template), as
    the prompt scored raw after that turn rendered by hand (SmolLM2's ChatML)."""
    system = "Complete the sentence."
    contexts = ["The sun", "The snow"]
    ending = "is very hot."
    [out] = local_cluster.generate(
        [{"prompt": ending, "choices": contexts, "answer": 0}], model=str(SMOLLM2),
        template="chat", system=system, max_new_tokens=0, score=True,
        choices_as_contexts=True, progress=False,
    )
    rendered = [
        f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{c}<|im_end|>\n"
        "<|im_start|>assistant\n"
        for c in contexts
    ]
    # The text as the one choice after each turn rendered (its newline scored with it).
    alone = local_cluster.generate(
        [{"prompt": c, "choices": [ending]} for c in rendered], model=str(SMOLLM2),
        template="none", max_new_tokens=0, score=True, progress=False,
    )
    for scored, by_hand in zip(out["choice_scores"], alone):
        [by_hand] = by_hand["choice_scores"]
        assert scored["tokens"] == by_hand["tokens"] > 0
        assert abs(scored["logprob"] - by_hand["logprob"]) < 1e-3, (scored, by_hand)


def test_scoring_arguments_that_cannot_work_are_refused_in_words(local_cluster):
    # A score reads the raw text unless told otherwise.
    [scored] = local_cluster.generate(["a text"], model=str(SMOLLM2), score=True, progress=False)
    assert scored["score"]["tokens"] > 0, scored
    with pytest.raises(resident.BadInput, match="choices_as_contexts` .* needs score"):
        local_cluster.generate(
            ["a text"], model=str(SMOLLM2), template="chat", choices_as_contexts=True,
            progress=False,
        )
    with pytest.raises(resident.BadInput, match="needs score"):
        local_cluster.generate(
            ["a text"], model=str(SMOLLM2), template="none", prompt_logprobs=2, progress=False
        )
    with pytest.raises(resident.BadInput, match="context"):
        local_cluster.generate(
            [{"prompt": "a", "context": 3}], model=str(SMOLLM2), template="none", score=True,
            progress=False,
        )
    # The window arguments reach the job's parameters and are checked there.
    with pytest.raises(resident.BadInput, match="score_stride` must be at least 1"):
        local_cluster.generate(
            ["a text"], model=str(SMOLLM2), template="none", score=True, score_stride=0,
            progress=False,
        )
    with pytest.raises(resident.BadInput, match="max_score_windows` caps the scoring windows"):
        local_cluster.generate(
            ["a text"], model=str(SMOLLM2), template="none", max_score_windows=1,
            progress=False,
        )


def test_eval_runs_each_task_as_its_generate_job_on_one_pool(local_cluster, tmp_path):
    mc = write_corpus(tmp_path / "mc.jsonl", [
        {"id": "fr", "text": "The capital of France is", "choices": [" Berlin", " Paris"],
         "answer": 1},
        {"id": "sky", "text": "The sky is", "choices": [" green", " blue"], "answer": 1},
        {"id": "ice", "text": "Ice is", "choices": [" hot", " cold"], "answer": 1},
    ])
    qa = write_corpus(tmp_path / "qa.jsonl", [
        {"id": i, "text": q, "gold": g} for i, (q, g) in enumerate(
            [("What is the capital of France?", "Paris"), ("How many legs does a spider have?", "8")])
    ])
    tasks = {
        "mc": dict(input=str(mc), prompt="{text}", score=True, max_new_tokens=0, template="none"),
        "qa": dict(input=str(qa), prompt="{text}", max_new_tokens=12, reference_field="gold",
                   extract=r"([A-Za-z0-9]+)", extract_match="last", ignore_case=True),
    }
    suite = tmp_path / "suite"
    results = local_cluster.eval(tasks, model=str(SMOLLM2), output=str(suite), progress=False)
    assert [task["name"] for task in results["tasks"]] == ["mc", "qa"]
    assert results["tasks"][0]["pool"] == results["tasks"][1]["pool"], "one pool, one load"
    assert json.load(open(suite / "results.json")) == results
    for name in ("mc", "qa"):
        arguments = dict(tasks[name])
        local_cluster.generate_job(
            arguments.pop("input"), str(SMOLLM2), str(tmp_path / f"alone-{name}"),
            arguments.pop("prompt"), progress=False, **arguments,
        )
        alone = open(tmp_path / f"alone-{name}" / "generations.jsonl").read()
        assert open(suite / name / "generations.jsonl").read() == alone, name
    report = json.load(open(suite / "mc" / "report.json"))
    acc = next(m for m in results["tasks"][0]["metrics"] if m["metric"] == "acc")
    assert (acc["value"], acc["stderr"], acc["records"]) == (
        report["accuracy"], report["accuracy_stderr"], 3)
    table = resident.eval_table(results)
    assert table.startswith("| task | metric | value | ± stderr | records |"), table
    assert f"| mc | acc | {acc['value']:.4f} |" in table, table
    assert all(pool.name != results["tasks"][0]["pool"] for pool in local_cluster.pools())
    # Only qa again: it resumes, and results.json keeps mc's earlier results beside it.
    again = local_cluster.eval(tasks, model=str(SMOLLM2), output=str(suite), only=["qa"],
                               progress=False)
    assert [task["name"] for task in again["tasks"]] == ["mc", "qa"]
    assert again["tasks"][0] == results["tasks"][0]
    assert again["tasks"][1]["metrics"] == results["tasks"][1]["metrics"]
    assert json.load(open(suite / "results.json")) == again
    with pytest.raises(resident.BadInput, match="task 'a': model is the suite's"):
        local_cluster.eval({"a": dict(input=str(qa), prompt="{text}", model="x")},
                           model=str(SMOLLM2), output=str(tmp_path / "bad"))
    with pytest.raises(resident.BadInput, match='the suite has no task "x": it has mc, qa'):
        local_cluster.eval(tasks, model=str(SMOLLM2), output=str(tmp_path / "bad"), only=["x"])
    assert not (tmp_path / "bad").exists()


def test_a_suite_file_runs_from_python_as_resident_eval_runs_it(local_cluster, tmp_path):
    """Cluster.eval takes the suite file resident eval takes: each task's flags read as
    generate_job's keywords (values after the flag or after `=`, switches, repeated and
    comma-separated flags, `-n`, the default prompt), the same lines and figures as the
    CLI's; a flag Python cannot take, one resident generate lacks and a bad value are
    refused, naming the task."""
    mc = write_corpus(tmp_path / "mc.jsonl", [
        {"id": "fr", "text": "The capital of France is", "choices": ["Berlin", "Paris"],
         "answer": 1},
        {"id": "sky", "text": "The sky is", "choices": ["green", "blue"], "answer": 1},
        {"id": "ice", "text": "Ice is", "choices": ["hot", "cold"], "answer": 1},
    ])
    qa = write_corpus(tmp_path / "qa.jsonl", [
        {"id": i, "text": q, "gold": g} for i, (q, g) in enumerate(
            [("What is the capital of France?", "Paris"), ("How many legs does a spider have?", "8"),
             ("What colour is the sky?", "blue")])
    ])
    suite = tmp_path / "suite.toml"
    suite.write_text(f"""
flags = ["--template", "none", "--max-sequences=4"]

[[task]]
name = "mc"
flags = ["--input", {json.dumps(str(mc))}, "--prompt", "{{text}}", "--score",
         "--max-new-tokens", "0", "--target-delimiter", " ", "--choice-labels", "A,B",
         "--choice-labels", "C"]

[[task]]
name = "mc-texts"
flags = ["--input", {json.dumps(str(mc))}, "--score",
         "--max-new-tokens", "0", "--target-delimiter", " "]

[[task]]
name = "qa"
flags = ["--input", {json.dumps(str(qa))}, "--prompt", "Q: {{text}}\\nA:", "--max-new-tokens=12",
         "--stop", "\\n", "--stop", "Q:", "--reference-field", "gold", "--ignore-case",
         "--filter", "word=([A-Za-z0-9]+)", "--filter", "last:last=([A-Za-z0-9]+)",
         "--ignore-regex", ",", "-n", "1", "--limit", "2"]
""")
    run_resident("eval", "--tasks", str(suite), "--model", str(SMOLLM2),
                 "--output", str(tmp_path / "cli"))
    cli = json.load(open(tmp_path / "cli" / "results.json"))
    ours = local_cluster.eval(suite, model=str(SMOLLM2), output=str(tmp_path / "py"),
                              progress=False)
    assert [t["name"] for t in ours["tasks"]] == ["mc", "mc-texts", "qa"]
    for theirs, mine in zip(cli["tasks"], ours["tasks"]):
        assert mine["metrics"] == theirs["metrics"], (mine, theirs)
        assert mine["records"] == theirs["records"], (mine, theirs)
        name = mine["name"]
        lines = (tmp_path / "py" / name / "generations.jsonl").read_text()
        assert lines == (tmp_path / "cli" / name / "generations.jsonl").read_text(), name
    assert ours["tasks"][2]["records"] == 2, "--limit 2"
    qa_report = json.load(open(tmp_path / "py" / "qa" / "report.json"))
    assert [name for name in qa_report["filters"]] == ["word", "last"], qa_report
    # The labels of both --choice-labels, in order (the last alone, C, would leave each
    # record's second choice without a label: a bad record).
    assert ours["tasks"][0]["records"] == 3, ours["tasks"][0]

    def refused(flags: str, match: str) -> None:
        bad = tmp_path / "bad.toml"
        bad.write_text(f'[[task]]\nname = "x"\nflags = {flags}\n')
        with pytest.raises(resident.BadInput, match=match):
            local_cluster.eval(str(bad), model=str(SMOLLM2), output=str(tmp_path / "bad"))
        assert not (tmp_path / "bad").exists()

    refused('["--input", "a.jsonl", "--task-timeout", "5m"]',
            "task 'x' gives --task-timeout: generate_job keeps the default task timeout")
    refused('["--input", "a.jsonl", "--cluster", "http://h:1"]', "task 'x' gives --cluster")
    refused('["--input", "a.jsonl", "--bogus", "1"]',
            "task 'x': --bogus is not a flag of resident generate")
    refused('["--input", "a.jsonl", "--fewshot", "five"]', "task 'x': --fewshot 'five'")
    refused('["--input", "a.jsonl", "--score=yes"]', "task 'x': --score takes no value")
    refused('["--input", "a.jsonl", "--prompt"]', "task 'x': --prompt needs a value")
    refused('["--input", "a.jsonl", "--model", "m"]', "give --model")
    with pytest.raises(resident.BadInput, match="reading the suite"):
        local_cluster.eval(str(tmp_path / "none.toml"), model=str(SMOLLM2),
                           output=str(tmp_path / "bad"))


def test_a_suite_s_flags_read_as_clap_reads_them(tmp_path):
    """The flags of a task as generate_job's keywords, read as the CLI reads them: the last
    of a flag given twice, every value of a repeated one, commas split where the CLI splits
    them, KEY=VALUE pairs as a dict, a schema file as OpenAI's response_format."""
    from resident import _suite

    schema = tmp_path / "schema.json"
    schema.write_text('{"type": "object"}')
    kwargs = _suite.task_kwargs("t", [
        "--input", "a.jsonl", "--seed=3", "--seed", "4", "--selector", "gpu=a10g,zone=b",
        "--selector=rack=7", "--price", "on-prem=0.5", "--stop-token-ids", "1,2",
        "--stop", "a,b", "--limit", "0.25", "--top-p", "0.9", "--json-schema", str(schema),
        "--score", "--min-p=0.1",
    ])
    assert kwargs == {
        "input": "a.jsonl", "prompt": "{text}", "seed": 4, "selector": {"gpu": "a10g", "zone": "b", "rack": "7"},
        "price": {"on-prem": 0.5}, "stop_token_ids": [1, 2], "stop": ["a,b"], "limit": 0.25,
        "top_p": 0.9, "score": True, "min_p": 0.1,
        "response_format": {"type": "json_schema", "json_schema": {
            "name": "output", "schema": {"type": "object"}, "strict": True}},
    }
    assert _suite.task_kwargs("t", ["--limit", "40"]) == {"limit": 40, "prompt": "{text}"}
    with pytest.raises(resident.BadInput, match="task 't': --selector 'gpu': 'gpu' is not KEY=VALUE"):
        _suite.task_kwargs("t", ["--selector", "gpu"])
    with pytest.raises(resident.BadInput, match="task 't': 'a.jsonl' is not a flag"):
        _suite.task_kwargs("t", ["a.jsonl"])
    with pytest.raises(resident.BadInput, match="--json-schema .*: cannot read it"):
        _suite.task_kwargs("t", ["--json-schema", str(tmp_path / "none.json")])
    # --guided-*: a choice repeated adds one (commas kept), a regex given again replaces
    # the first, a grammar file is read; two kinds are refused, as clap refuses them.
    grammar = tmp_path / "g.lark"
    grammar.write_text('start: "a"+')
    constrained = {
        ("--guided-choice", "yes", "--guided-choice=no, never"):
            {"type": "choice", "choice": ["yes", "no, never"]},
        ("--guided-regex", "a+", "--guided-regex", "[0-9]+"): {"type": "regex", "regex": "[0-9]+"},
        ("--guided-grammar", str(grammar)): {"type": "grammar", "grammar": 'start: "a"+'},
    }
    for flags, expected in constrained.items():
        assert _suite.task_kwargs("t", list(flags)) == {
            "prompt": "{text}", "response_format": expected}, flags
    with pytest.raises(resident.BadInput, match="--guided-choice 'a': cannot be used with "
                       "--guided-regex"):
        _suite.task_kwargs("t", ["--guided-regex", "a", "--guided-choice", "a"])
    with pytest.raises(resident.BadInput, match="--guided-grammar .*: cannot read it"):
        _suite.task_kwargs("t", ["--guided-grammar", str(tmp_path / "none.lark")])


def test_a_suite_s_flag_table_covers_every_flag_of_resident_generate():
    """Each flag resident generate takes has its keyword or its refusal in the suite's
    tables, and the tables name no flag it lacks."""
    from resident import _suite

    help_text = run_resident("generate", "--help").stdout
    flags = set(re.findall(r"^\s+(?:(-\w), )?(--[a-z0-9-]+)", help_text, re.MULTILINE))
    cli = {flag for pair in flags for flag in pair if flag} - {"--help", "-h"}
    assert cli == _suite.every_flag(), (cli - _suite.every_flag(), _suite.every_flag() - cli)
    # A flag left out of a task means what it means on the command line: generate_job's
    # default is the CLI's (the prompt's, which generate_job asks for, the suite supplies).
    import inspect

    defaults = dict(re.findall(r"^\s+(?:-\w, )?(--[a-z0-9-]+)[^\n]*\n(?:(?!^\s+-).*\n)*?.*"
                               r"\[default: ([^\]]*)\]", help_text, re.MULTILINE))
    signature = inspect.signature(resident.Cluster.generate_job).parameters
    compared = 0
    for flag, default in defaults.items():
        keyword, read = _suite.VALUED.get(flag, (None, None))
        if keyword not in signature or default == "auto" or flag == "--prompt":
            continue
        value = read(json.loads(default) if default.startswith('"') else default)
        assert signature[keyword].default == value, (flag, default, signature[keyword].default)
        compared += 1
    assert compared >= 15, defaults
    assert _suite.task_kwargs("t", [])["prompt"] == defaults["--prompt"]


def test_eval_writes_to_an_s3_output_what_it_writes_to_a_directory(local_cluster, s3_server, tmp_path):
    mc = write_corpus(tmp_path / "mc.jsonl", [
        {"id": "fr", "text": "The capital of France is", "choices": [" Berlin", " Paris"],
         "answer": 1},
        {"id": "ice", "text": "Ice is", "choices": [" hot", " cold"], "answer": 1},
    ])
    tasks = {"mc": dict(input=str(mc), prompt="{text}", score=True, max_new_tokens=0,
                        template="none", s3_endpoint=s3_server, price={"on-prem": 0.5},
                        selector={})}
    local = local_cluster.eval(tasks, model=str(SMOLLM2), output=str(tmp_path / "local"),
                               progress=False)
    on_s3 = local_cluster.eval(tasks, model=str(SMOLLM2), output="s3://out/evals/",
                               progress=False)
    assert on_s3["tasks"][0]["output"] == "s3://out/evals/mc"
    assert on_s3["tasks"][0]["metrics"] == local["tasks"][0]["metrics"]
    # s3s-fs keeps each object as a file under its data directory.
    objects = tmp_path / "s3-data" / "out" / "evals"
    assert json.load(open(objects / "results.json")) == on_s3
    report = json.load(open(objects / "mc" / "report.json"))
    assert report["prices"]["per_pool_label"] == {"on-prem": 0.5}, report["prices"]
    assert (objects / "mc" / "generations.jsonl").read_text() == (
        tmp_path / "local" / "mc" / "generations.jsonl").read_text()
    # A task added and run alone: results.json on S3 keeps mc's earlier results.
    more = {**tasks, "mc2": tasks["mc"]}
    both = local_cluster.eval(more, model=str(SMOLLM2), output="s3://out/evals/",
                              only=["mc2"], progress=False)
    assert [task["name"] for task in both["tasks"]] == ["mc", "mc2"]
    assert both["tasks"][0] == on_s3["tasks"][0]
    assert json.load(open(objects / "results.json")) == both
    other = {**tasks, "qa": {**tasks["mc"], "s3_endpoint": "http://127.0.0.1:1"}}
    with pytest.raises(resident.BadInput, match="the tasks name different s3_endpoint values"):
        local_cluster.eval(other, model=str(SMOLLM2), output="s3://out/other", progress=False)
    assert not (tmp_path / "s3-data" / "out" / "other").exists()
