"""resident.local(): a scheduler and an agent in this process."""

from __future__ import annotations

import json

import numpy as np
import pytest

import resident
from conftest import MINILM, SMOLLM2, wiki_texts


def test_embed_gives_normalised_rows_in_input_order(local_cluster):
    texts = [r["text"] for r in wiki_texts(40)]
    vectors = local_cluster.embed(texts, model=str(MINILM), progress=False)
    assert vectors.dtype == np.float32 and vectors.shape == (40, 384)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    # Each text alone gives its own row: the order is the input's.
    for i in (0, 17, 39):
        alone = local_cluster.embed([texts[i]], model=str(MINILM), progress=False)
        np.testing.assert_allclose(alone[0], vectors[i], atol=1e-5)


def test_embed_takes_a_numpy_array_and_an_iterator(local_cluster):
    texts = [r["text"] for r in wiki_texts(10)]
    from_list = local_cluster.embed(texts, model=str(MINILM), progress=False)
    from_array = local_cluster.embed(np.array(texts), model=str(MINILM), progress=False)
    from_iterator = local_cluster.embed((t for t in texts), model=str(MINILM), progress=False)
    np.testing.assert_array_equal(from_list, from_array)
    np.testing.assert_array_equal(from_list, from_iterator)


def test_a_text_that_is_not_a_string_is_bad_input(local_cluster):
    with pytest.raises(resident.BadInput) as refused:
        local_cluster.embed(["fine", b"bytes"], model=str(MINILM), progress=False)
    assert "text 1 is a bytes, not a str" in str(refused.value)
    assert refused.value.kind == "BadInput"


def test_nodes_pools_and_jobs_are_plain_objects(local_cluster):
    local_cluster.embed(["warm"], model=str(MINILM), progress=False)
    nodes = local_cluster.nodes()
    assert [n.state for n in nodes] == ["alive"]
    assert nodes[0].node_id == "local" and nodes[0].gpus == []
    # The session's cluster holds many embed pools, and keeps only the newest finished
    # jobs: the warm call's job is the newest, and its pool is one of the embed pools.
    jobs = local_cluster.jobs()
    warm = max(jobs, key=lambda j: j.started_unix_ms)
    assert warm.name == "embed" and warm.state == "succeeded", warm
    assert warm.finished_unix_ms >= warm.started_unix_ms > 0, warm
    pools = {p.name: p for p in local_cluster.pools()}
    assert pools[warm.pool].kind == "embed" and pools[warm.pool].ready_actors >= 1, pools[warm.pool]


def test_no_texts_give_no_rows_and_a_job_that_has_ended(local_cluster):
    vectors = local_cluster.embed([], model=str(MINILM), progress=False)
    assert vectors.shape == (0, 0)
    assert list(local_cluster.embed_iter(iter([]), model=str(MINILM), progress=False)) == []
    newest = max(local_cluster.jobs(), key=lambda j: j.started_unix_ms)
    assert newest.name == "embed" and newest.state == "succeeded", newest
    assert newest.finished_unix_ms >= newest.started_unix_ms > 0, newest


def test_an_echo_pool_maps_in_order_and_submits_as_results_finish(local_cluster):
    pool = local_cluster.pool("echo-pool", kind="echo", replicas=2)
    assert pool.name == "echo-pool"
    assert pool.map([b"a", b"b", b"c"]) == [b"a", b"b", b"c"]
    finished = dict(pool.submit([b"x%d" % i for i in range(20)]))
    assert finished == {i: b"x%d" % i for i in range(20)}
    assert pool.status().replicas == 2
    attached = local_cluster.pool("echo-pool")
    assert attached.map([b"again"]) == [b"again"]
    pool.delete()
    with pytest.raises(resident.BadInput) as gone:
        local_cluster.pool("echo-pool")
    assert gone.value.kind == "NotFound"


def test_generate_answers_greedily_with_token_counts(local_cluster, monkeypatch):
    moves = []

    class RecordingBar(resident.Bar):
        def set(self, position, total=None, note=""):
            moves.append((position, total))
            super().set(position, total, note)

    monkeypatch.setattr(resident, "Bar", RecordingBar)
    outs = local_cluster.generate(
        ["Answer in one sentence: What is the capital of France?", "Say hello."],
        model=str(SMOLLM2), max_new_tokens=24,
    )
    # The bar counts prompts as their tasks finish, and ends at all of them.
    assert moves and moves[-1] == (2, 2), moves
    assert len(outs) == 2
    assert "Paris" in outs[0]["text"], outs[0]
    for out in outs:
        assert 1 <= out["tokens"] <= 24 and out["prompt_tokens"] > 5
        assert out["finish_reason"] in ("stop", "length")
    stopped = local_cluster.generate(
        ["Answer in one sentence: What is the capital of France?"], model=str(SMOLLM2),
        max_new_tokens=24, stop=["Paris"],
    )
    assert stopped[0]["finish_reason"] == "stop" and "Paris" not in stopped[0]["text"]


def test_chat_answers_conversations_and_takes_the_sampling_controls(local_cluster):
    question = "What is the capital of France?"
    # A conversation of one user turn is the plain prompt; a system message changes it.
    plain = local_cluster.generate([question], model=str(SMOLLM2), max_new_tokens=16,
                                   progress=False)
    chatted = local_cluster.chat([[{"role": "user", "content": question}]], model=str(SMOLLM2),
                                 max_new_tokens=16, progress=False)
    assert chatted[0]["text"] == plain[0]["text"], (chatted, plain)
    pirate = [{"role": "system", "content": "You are a pirate. Answer in pirate speech."},
              {"role": "user", "content": question}]
    with_system = local_cluster.generate([question], model=str(SMOLLM2), max_new_tokens=16,
                                         system=pirate[0]["content"], progress=False)
    as_chat = local_cluster.chat([pirate], model=str(SMOLLM2), max_new_tokens=16,
                                 progress=False)
    assert with_system[0]["text"] == as_chat[0]["text"] != plain[0]["text"]

    # n, logprobs and a JSON schema; a conversation's own parameters; a bad one refused alone.
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
              "required": ["city"], "additionalProperties": False}
    outs = local_cluster.chat(
        [
            {"messages": [{"role": "user", "content": question}], "n": 2, "temperature": 1.0},
            {"messages": [{"role": "user", "content": question}], "logprobs": True,
             "top_logprobs": 2},
            {"messages": [{"role": "user", "content": question}],
             "response_format": {"type": "json_schema",
                                 "json_schema": {"name": "city", "schema": schema}}},
            {"messages": [{"role": "user", "content": question}], "temperature": -1},
        ],
        model=str(SMOLLM2), max_new_tokens=24, seed=3, progress=False,
    )
    assert len(outs[0]["choices"]) == 2 and outs[0]["choices"][0]["text"] == outs[0]["text"]
    steps = outs[1]["logprobs"]
    assert steps and all(len(step["top_logprobs"]) == 2 for step in steps)
    assert steps[0]["top_logprobs"][0]["token"] == steps[0]["token"]
    assert json.loads(outs[2]["text"])["city"], outs[2]
    assert "temperature" in outs[3]["error"] and outs[3]["text"] == "", outs[3]

    with pytest.raises(resident.BadInput) as refused:
        local_cluster.generate([question], model=str(SMOLLM2), min_p=2.0, progress=False)
    assert "min_p" in str(refused.value), refused.value
    with pytest.raises(resident.BadInput) as refused:
        local_cluster.generate([question], model=str(SMOLLM2), best_of=2, progress=False)
    assert "best_of" in str(refused.value) and "repetition_penalty" in str(refused.value)


def test_a_choice_a_regex_and_a_grammar_hold_each_completion_and_bad_ones_are_refused(
        local_cluster):
    """response_format's choice, regex and grammar types (resident generate's --guided-*),
    the call's or a prompt's own (vLLM's guided_choice), hold every completion; one that
    does not compile is refused before any pool, naming what failed."""
    import re

    reviews = ["I loved this film.", "Awful food and rude staff.", "Great coffee, lovely view!"]
    ask = [f"Is this review positive or negative? {review}" for review in reviews]
    labels = local_cluster.generate(
        ask, model=str(SMOLLM2), max_new_tokens=8, progress=False,
        response_format={"type": "choice", "choice": ["positive", "negative"]})
    assert all(out["text"] in ("positive", "negative") for out in labels), labels
    years = local_cluster.generate(
        [f"In which year was this written? {review}" for review in reviews],
        model=str(SMOLLM2), max_new_tokens=8, progress=False,
        response_format={"type": "regex", "regex": "(19|20)[0-9]{2}"})
    assert all(re.fullmatch("(19|20)[0-9]{2}", out["text"]) for out in years), years
    grammar = 'start: ("yes" | "no") ", " /[a-z]{2,12}/'
    reasons = local_cluster.generate(
        ask, model=str(SMOLLM2), max_new_tokens=12, progress=False,
        response_format={"type": "grammar", "grammar": grammar})
    assert all(re.fullmatch("(yes|no), [a-z]{2,12}", out["text"]) for out in reasons), reasons
    own = local_cluster.generate([{"prompt": ask[0], "guided_choice": ["up", "down"]}],
                                 model=str(SMOLLM2), max_new_tokens=8, progress=False)
    assert own[0]["text"] in ("up", "down"), own

    with pytest.raises(resident.BadInput, match="`response_format` does not compile: "
                       "the regular expression cannot be used"):
        local_cluster.generate(ask, model=str(SMOLLM2), progress=False,
                               response_format={"type": "regex", "regex": "(?=a)b"})
    with pytest.raises(resident.BadInput, match="`response_format` lists no choices"):
        local_cluster.generate(ask, model=str(SMOLLM2), progress=False,
                               response_format={"type": "choice", "choice": []})


def test_chat_template_kwargs_reach_the_template_as_its_variables(local_cluster):
    """chat_template_kwargs={"enable_thinking": False} reaches a reasoning model's template
    (the end-to-end tests' fixture, in the manner of Qwen3's): the answer is that of the
    prompt it renders, fed raw; a variable the renderer sets is refused before any pool."""
    from conftest import REPO

    template = (REPO / "tests" / "fixtures" / "reasoning_chat_template.jinja").read_text()
    question = "What is the capital of France?"
    off = local_cluster.chat([[{"role": "user", "content": question}]], model=str(SMOLLM2),
                             max_new_tokens=8, chat_template=template,
                             chat_template_kwargs={"enable_thinking": False}, progress=False)
    rendered = (f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"
                "<think>\n\n</think>\n\n")
    raw = local_cluster.generate([rendered], model=str(SMOLLM2), max_new_tokens=8,
                                 template="none", progress=False)
    assert off[0]["text"] == raw[0]["text"], (off, raw)
    assert off[0]["prompt_tokens"] == raw[0]["prompt_tokens"], (off, raw)
    with pytest.raises(resident.BadInput, match="cannot set `messages`"):
        local_cluster.chat([[{"role": "user", "content": question}]], model=str(SMOLLM2),
                           chat_template=template, chat_template_kwargs={"messages": []},
                           progress=False)


def test_reasoning_parser_splits_the_thinking_from_each_answer(local_cluster):
    """reasoning_parser="deepseek_r1" on SmolLM2 taught to think by few-shot examples (the
    answer's thinking opened, as DeepSeek-R1's template opens it): each completion's text,
    and each sample's, is its answer and ``reasoning`` its thinking, which with the answer
    make the raw completion; a parser vLLM does not name is refused before any pool."""
    examples = ("Q: 1+1?\n<think>1 plus 1 makes 2</think>A: 2\n"
                "Q: 2+3?\n<think>2 plus 3 makes 5</think>A: 5\n")
    prompts = [f"{examples}Q: {sum}?\n<think>" for sum in ("2+2", "3+5", "1+6")]
    common = dict(model=str(SMOLLM2), template="none", max_new_tokens=24, stop=["\n"],
                  progress=False)
    raw = local_cluster.generate(prompts, **common)
    parsed = local_cluster.generate(prompts, reasoning_parser="deepseek_r1", **common)
    for raw_one, one in zip(raw, parsed):
        assert "</think>" in raw_one["text"], raw_one
        assert raw_one["text"] == one["reasoning"] + "</think>" + one["text"], (raw_one, one)
        assert 0 < one["reasoning_tokens"] < one["tokens"], one
        assert "reasoning" not in raw_one
    sampled = local_cluster.generate(prompts[:1], reasoning_parser="qwen3", n=2,
                                     temperature=0.8, **common)
    assert len(sampled[0]["choices"]) == 2, sampled
    for choice in sampled[0]["choices"]:
        assert "</think>" not in choice["text"], choice
        if "reasoning" in choice:
            assert choice["reasoning_tokens"] > 0, choice
    with pytest.raises(resident.BadInput, match="use one of qwen3, deepseek_r1"):
        local_cluster.generate(prompts[:1], reasoning_parser="granite", **common)


def test_a_call_releases_the_gil_while_it_waits(local_cluster):
    import threading
    import time

    texts = [r["text"] for r in wiki_texts(600)]
    local_cluster.embed(texts[:8], model=str(MINILM), progress=False)
    ticks = 0
    stop = threading.Event()

    def count():
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            time.sleep(0.001)

    counter = threading.Thread(target=count)
    counter.start()
    began = time.perf_counter()
    local_cluster.embed(texts, model=str(MINILM), progress=False)
    took = time.perf_counter() - began
    stop.set()
    counter.join()
    # Held through the call, the GIL would have let the counter run only at the 100 ms
    # ticks: a few per tick at most.
    assert took > 0.5, took
    assert ticks > 100 * took, (ticks, took)


def test_a_cluster_closes_at_the_end_of_a_with_block_and_deletes_its_pools():
    with resident.local() as cluster:
        vectors = cluster.embed(["closed after this"], str(MINILM), replicas=1, progress=False)
        assert vectors.shape == (1, 384)
        assert any(p.name.startswith("py-embed") for p in cluster.pools())
        watcher = resident.Cluster(cluster._native)
    # The package's pool is gone; the cluster refuses further calls, in words.
    assert not any(p.name.startswith("py-embed") for p in watcher.pools())
    with pytest.raises(resident.BadInput, match="closed"):
        cluster.nodes()
    cluster.close()


def test_gpus_are_used_by_default_and_gpus_zero_keeps_the_cpu():
    # Simulated GPUs are capacity only (the work runs on the CPU), enough to see the choice.
    with resident.local(simulate_gpus="T4:16GiB x2") as cluster:
        texts = [r["text"] for r in wiki_texts(8)]
        on_gpus = cluster.embed(texts, model=str(MINILM), progress=False)
        on_cpu = cluster.embed(texts, model=str(MINILM), gpus=0, replicas=1, progress=False)
        np.testing.assert_allclose(on_gpus, on_cpu, atol=1e-5)
        embed_actors = [a for a in cluster.actors() if a.pool.startswith("py-embed")]
        placed = sorted(a.gpu_index for a in embed_actors if a.gpu_index is not None)
        assert placed == [0, 1], embed_actors
        assert sum(a.gpu_index is None for a in embed_actors) == 1, embed_actors


def test_a_chat_template_given_renders_in_place_of_the_model_s_own(local_cluster):
    template = ("{% for m in messages %}### {{ m.role | upper }}:\n{{ m.content }}\n"
                "{% endfor %}{% if add_generation_prompt %}### ASSISTANT:\n{% endif %}")
    question = "What is the capital of France?"
    chatted = local_cluster.chat([[{"role": "user", "content": question}]], model=str(SMOLLM2),
                                 max_new_tokens=12, chat_template=template, progress=False)
    raw = local_cluster.generate([f"### USER:\n{question}\n### ASSISTANT:\n"],
                                 model=str(SMOLLM2), max_new_tokens=12, template="none",
                                 progress=False)
    assert chatted[0]["text"] == raw[0]["text"], (chatted, raw)
    assert chatted[0]["prompt_tokens"] == raw[0]["prompt_tokens"]
    # One that does not compile is refused before a pool is asked for, as the CLI's is.
    pools = len(local_cluster.pools())
    asked = [{"role": "user", "content": question}]
    for call, prompt in ((local_cluster.chat, asked), (local_cluster.generate, question)):
        with pytest.raises(resident.BadInput, match="chat_template does not compile: syntax"):
            call([prompt], model=str(SMOLLM2), chat_template="{% for m in messages %}",
                 progress=False)
    assert len(local_cluster.pools()) == pools
