"""embed_job: the resumable corpus job, against the Rust path; killed with -9 and resumed;
Ctrl-C mid-job."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import resident
from conftest import MINILM, RESIDENT_BIN, REPO, run_python, wiki_texts, write_corpus


def test_embed_and_embed_job_give_the_vectors_of_resident_embed(local_cluster, tmp_path):
    records = wiki_texts(300)
    corpus = write_corpus(tmp_path / "corpus.jsonl", records)
    subprocess.run(
        [str(RESIDENT_BIN), "embed", "--input", str(corpus), "--model", str(MINILM),
         "--output", str(tmp_path / "rust")],
        check=True, capture_output=True,
    )
    rust = np.load(tmp_path / "rust" / "embeddings.npy")
    report = local_cluster.embed_job(str(corpus), str(MINILM), str(tmp_path / "py"), progress=False)
    assert report["items"] == 300
    from_job = np.load(tmp_path / "py" / "embeddings.npy")
    from_call = local_cluster.embed([r["text"] for r in records], model=str(MINILM), progress=False)
    np.testing.assert_allclose(from_job, rust, atol=1e-6)
    np.testing.assert_allclose(from_call, rust, atol=1e-6)
    # limit= (--limit): the input's first records only.
    first = local_cluster.embed_job(
        str(corpus), str(MINILM), str(tmp_path / "first"), limit=np.int64(40), progress=False
    )
    assert first["items"] == 40 and first["limit"] == 40, first
    np.testing.assert_allclose(np.load(tmp_path / "first" / "embeddings.npy"), rust[:40], atol=1e-6)
    # A share of the records, rounded up (lm-evaluation-harness's --limit 0.1): 0.13 of 300
    # is the first 39.
    share = local_cluster.embed_job(
        str(corpus), str(MINILM), str(tmp_path / "share"), limit=0.13, progress=False
    )
    assert (share["items"], share["limit"], share["limit_share"]) == (39, 39, 0.13), share
    np.testing.assert_allclose(np.load(tmp_path / "share" / "embeddings.npy"), rust[:39], atol=1e-6)
    # limit_by= (--limit-by): the limit of each value of a field, here a tenth of each part.
    parts = write_corpus(tmp_path / "parts.jsonl",
                         [{**r, "part": "a" if i % 3 == 0 else "b"} for i, r in enumerate(records)])
    by = local_cluster.embed_job(str(parts), str(MINILM), str(tmp_path / "by"), limit=0.1,
                                 limit_by="part", progress=False)
    kept = [i for i in range(300) if i % 3 == 0][:10] + [i for i in range(300) if i % 3][:20]
    assert (by["items"], by["limit_by"], by["limit_share"]) == (30, "part", 0.1), by
    np.testing.assert_allclose(np.load(tmp_path / "by" / "embeddings.npy"), rust[sorted(kept)],
                               atol=1e-6)
    with pytest.raises(resident.BadInput, match="give limit too"):
        local_cluster.embed_job(str(parts), str(MINILM), str(tmp_path / "zero"), limit_by="part")
    for refused in (0, 1.5, -0.1, float("nan"), "ten", True):
        with pytest.raises(resident.BadInput, match="count of records from 1"):
            local_cluster.embed_job(str(corpus), str(MINILM), str(tmp_path / "zero"),
                                    limit=refused)
    assert not (tmp_path / "zero").exists()


JOB = """
import resident, sys
cluster = resident.local()
print(cluster.embed_job(sys.argv[1], sys.argv[2], sys.argv[3], chunk_size=64, replicas=1,
                        format=sys.argv[4], keep_columns=sys.argv[5:] or None, progress=False))
"""


def _start_job(corpus: Path, out: Path, format: str = "npy", keep: tuple[str, ...] = ()) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", JOB, str(corpus), str(MINILM), str(out), format, *keep],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def _wait_for_shards(out: Path, count: int, process: subprocess.Popen, format: str = "npy") -> None:
    deadline = time.time() + 120
    while len(list((out / "shards").glob(f"*.{format}"))) < count:
        assert process.poll() is None, process.communicate()
        assert time.time() < deadline, "no shards written"
        time.sleep(0.05)


def test_embed_job_resumes_after_the_python_process_is_killed(local_cluster, tmp_path):
    """Parquet with a carried column, killed with -9 mid-job and resumed: pyarrow reads every
    id once in input order, each with its own title and vector."""
    import pyarrow.parquet as pq

    records = [dict(r, title=f"title of {r['id']}") for r in wiki_texts(1500)]
    corpus = write_corpus(tmp_path / "corpus.jsonl", records)
    out = tmp_path / "out"
    job = _start_job(corpus, out, "parquet", ("title",))
    # A shard's file appears a moment before its journal line: with 4 files on disk, at
    # least 3 chunks are journaled (waiting for 3 files raced the journal).
    _wait_for_shards(out, 4, job, "parquet")
    job.send_signal(signal.SIGKILL)
    job.wait()
    assert not (out / "embeddings.parquet").exists(), "killed before the end"
    report = local_cluster.embed_job(str(corpus), str(MINILM), str(out), chunk_size=64,
                                     format="parquet", keep_columns=["title"], progress=False)
    assert report["items"] == 1500
    assert report["computed_items"] <= 1500 - 3 * 64, "the killed run's shards are reused"
    table = pq.read_table(out / "embeddings.parquet")
    assert table.column("id").to_pylist() == [r["id"] for r in records], "every id once, in input order"
    assert table.column("title").to_pylist() == [r["title"] for r in records]
    vectors = np.stack([np.asarray(v, dtype=np.float32) for v in table.column("embedding").to_pylist()])
    expected = local_cluster.embed([records[i]["text"] for i in (0, 700, 1499)], model=str(MINILM), progress=False)
    np.testing.assert_allclose(vectors[[0, 700, 1499]], expected, atol=1e-6)


def test_ctrl_c_cancels_the_job_and_returns_control(tmp_path):
    records = wiki_texts(3000)
    corpus = write_corpus(tmp_path / "corpus.jsonl", records)
    out = tmp_path / "out"
    job = _start_job(corpus, out)
    _wait_for_shards(out, 1, job)
    interrupted = time.time()
    job.send_signal(signal.SIGINT)
    _, stderr = job.communicate(timeout=30)
    assert time.time() - interrupted < 10, "Ctrl-C returned control within seconds"
    assert job.returncode != 0
    assert "KeyboardInterrupt" in stderr, stderr
    assert not (out / "embeddings.npy").exists()


def test_generate_job_writes_a_line_per_record_in_order(local_cluster, tmp_path):
    from conftest import SMOLLM2

    records = [{"id": f"q{i}", "text": t} for i, t in enumerate(
        ["What is the capital of France?", "Name a colour.", "Say hello."])]
    corpus = write_corpus(tmp_path / "corpus.jsonl", records)
    report = local_cluster.generate_job(
        str(corpus), str(SMOLLM2), str(tmp_path / "out"), "Answer in one sentence: {text}",
        max_new_tokens=24, progress=False,
    )
    assert report["items"] == 3 and report["generated_tokens"] >= 3, report
    lines = [json.loads(line) for line in open(tmp_path / "out" / "generations.jsonl")]
    assert [line["id"] for line in lines] == ["q0", "q1", "q2"]
    assert all(1 <= line["generated_tokens"] <= 24 for line in lines), lines
    assert "Paris" in lines[0]["text"], lines[0]
    first = local_cluster.generate_job(
        str(corpus), str(SMOLLM2), str(tmp_path / "first"), "Answer in one sentence: {text}",
        max_new_tokens=24, progress=False, limit=2,
    )
    assert first["limit"] == 2, first
    assert [json.loads(line) for line in open(tmp_path / "first" / "generations.jsonl")] == lines[:2]
    with pytest.raises(resident.BadInput) as refused:
        local_cluster.generate_job(str(corpus), str(SMOLLM2), str(tmp_path / "bad"), "no field here", progress=False)
    assert "{text}" in str(refused.value), refused.value


def test_generate_job_keeps_input_columns_as_resident_generate_does(local_cluster, tmp_path):
    from conftest import SMOLLM2, resident as run_resident

    records = [
        {"id": "q0", "text": "Name a colour.", "source": {"set": "dev", "page": 3}},
        {"id": "q1", "text": "Say hello.", "source": {"set": "test"}},
        {"id": "q2", "text": "Count to three."},
    ]
    corpus = write_corpus(tmp_path / "corpus.jsonl", records)
    local_cluster.generate_job(
        str(corpus), str(SMOLLM2), str(tmp_path / "py"), "{text}", max_new_tokens=4,
        keep_columns="text=question, source.set=split", progress=False,
    )
    run_resident(
        "generate", "--input", str(corpus), "--model", str(SMOLLM2), "--prompt", "{text}",
        "--output", str(tmp_path / "cli"), "--max-new-tokens", "4",
        "--keep-columns", "text=question,source.set=split",
    )
    py, cli = (open(tmp_path / name / "generations.jsonl").read() for name in ("py", "cli"))
    assert py == cli
    lines = [json.loads(line) for line in py.splitlines()]
    assert [(line["question"], line["split"]) for line in lines] == [
        ("Name a colour.", "dev"), ("Say hello.", "test"), ("Count to three.", None)
    ]
    assert all(list(line)[:3] == ["id", "question", "split"] for line in lines), lines
    import pyarrow.parquet as pq

    local_cluster.generate_job(
        str(corpus), str(SMOLLM2), str(tmp_path / "parquet"), "{text}", max_new_tokens=4,
        keep_columns=["text=question", "source.set=split"], format="parquet", progress=False,
    )
    table = pq.read_table(tmp_path / "parquet" / "generations.parquet")
    assert table.column_names == [
        "id", "question", "split", "text", "reasoning", "prompt_tokens", "generated_tokens",
        "reasoning_tokens", "finish_reason", "truncated", "choices", "logprobs", "error",
    ]
    absent = {"truncated": False, "choices": None, "logprobs": None, "error": None,
              "reasoning": None, "reasoning_tokens": None}
    assert table.to_pylist() == [{**absent, **line} for line in lines]
    with pytest.raises(resident.BadInput) as refused:
        local_cluster.generate_job(
            str(corpus), str(SMOLLM2), str(tmp_path / "bad"), "{text}",
            keep_columns=["text"], progress=False,
        )
    assert "--keep-columns text=article" in str(refused.value), refused.value
    assert not (tmp_path / "bad").exists()


def test_generate_job_takes_resident_generate_s_engine_settings(local_cluster, tmp_path):
    """max_sequences, max_step_tokens, max_context, dtype, enforce_eager and
    attention_kernel reach the actors as resident generate's flags do: the same lines as
    the CLI's with those flags (a long text cut to the context cap in both), and generate's
    completion of the long text the same; a limit of 0 and an unknown dtype are refused,
    saying what to give."""
    from conftest import SMOLLM2

    long_text = " ".join(["The river ran past the old mill and on to the sea."] * 12)
    records = [{"id": "short", "text": "Name a colour."}, {"id": "long", "text": long_text},
               {"id": "hello", "text": "Say hello."}]
    corpus = write_corpus(tmp_path / "corpus.jsonl", records)
    engine = {"max_sequences": 2, "max_step_tokens": 24, "max_context": 48,
              "dtype": "quantised", "enforce_eager": True, "attention_kernel": "scalar"}
    report = local_cluster.generate_job(
        str(corpus), str(SMOLLM2), str(tmp_path / "py"), "{text}", template="none",
        max_new_tokens=8, progress=False, **engine,
    )
    assert report["truncated_prompts"] == 1, report
    flags = []
    for name, value in engine.items():
        flag = "--" + name.replace("_", "-")
        flags += [flag] if value is True else [flag, str(value)]
    subprocess.run(
        [str(RESIDENT_BIN), "generate", "--input", str(corpus), "--model", str(SMOLLM2),
         "--output", str(tmp_path / "cli"), "--prompt", "{text}", "--template", "none",
         "--max-new-tokens", "8", *flags],
        check=True, capture_output=True,
    )
    py_lines = open(tmp_path / "py" / "generations.jsonl").read()
    assert py_lines == open(tmp_path / "cli" / "generations.jsonl").read()
    cut = json.loads(py_lines.splitlines()[1])
    assert cut["prompt_tokens"] + cut["generated_tokens"] <= 48, cut
    # generate takes them too: the long text, cut alike, completed alike.
    (called,) = local_cluster.generate([long_text], model=str(SMOLLM2), template="none",
                                       max_new_tokens=8, progress=False, **engine)
    assert (called["text"], called["prompt_tokens"]) == (cut["text"], cut["prompt_tokens"])
    assert called["truncated"] is True, called
    with pytest.raises(resident.BadInput, match=r"max_sequences \(--max-sequences\) must be at least 1"):
        local_cluster.generate_job(str(corpus), str(SMOLLM2), str(tmp_path / "zero"), "{text}",
                                   max_sequences=0, progress=False)
    with pytest.raises(resident.BadInput, match=r"max_step_tokens \(--max-step-tokens\) must be"):
        local_cluster.chat([[{"role": "user", "content": "Hi"}]], model=str(SMOLLM2),
                           max_step_tokens=0, progress=False)
    with pytest.raises(resident.ResidentError, match="dtype `f8` is not one of auto, quantised"):
        local_cluster.generate_job(str(corpus), str(SMOLLM2), str(tmp_path / "f8"), "{text}",
                                   dtype="f8", progress=False)
