"""Prompts, precision and truncation from Python, against sentence-transformers' vectors
(tests/fixtures/minilm_prompts.json, made by scripts/make-prompt-fixture.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import resident
from conftest import MINILM, REPO, write_corpus

FIXTURE = json.loads((REPO / "tests" / "fixtures" / "minilm_prompts.json").read_text())


def prompted_minilm(root: Path) -> str:
    """MiniLM with the fixture's prompts file, as tests/src/lib.rs `prompted_minilm` makes it."""
    model = root / "minilm-prompts-in"
    shutil.copytree(MINILM, model)
    (model / "config_sentence_transformers.json").write_text(
        json.dumps({"prompts": FIXTURE["prompts"], "default_prompt_name": "passage"})
    )
    return str(model)


def cosines(ours: np.ndarray, theirs: list) -> np.ndarray:
    theirs = np.asarray(theirs, dtype=np.float32)
    dots = (ours * theirs).sum(axis=1)
    return dots / (np.linalg.norm(ours, axis=1) * np.linalg.norm(theirs, axis=1))


def test_embed_takes_a_prompt_by_name_or_text_like_sentence_transformers(local_cluster, tmp_path):
    model = prompted_minilm(tmp_path)
    texts = FIXTURE["texts"]
    queries = local_cluster.embed(texts, model, replicas=1, prompt_name="query", progress=False)
    assert cosines(queries, FIXTURE["vectors"]["query"]).min() >= 0.9999
    default = local_cluster.embed(texts, model, replicas=1, progress=False)
    assert cosines(default, FIXTURE["vectors"]["default"]).min() >= 0.9999
    none = local_cluster.embed(texts, model, replicas=1, prompt="", progress=False)
    assert cosines(none, FIXTURE["vectors"]["none"]).min() >= 0.9999
    raw = local_cluster.embed(texts, model, replicas=1, prompt="", normalize=False, progress=False)
    assert np.linalg.norm(raw, axis=1).min() > 1.5
    with pytest.raises(resident.BadInput, match="not both"):
        local_cluster.embed(texts, model, prompt_name="query", prompt="q: ", progress=False)
    with pytest.raises(resident.ResidentError, match="passage, query"):
        local_cluster.embed(texts, model, prompt_name="question", progress=False)


def test_embed_job_writes_compact_truncated_vectors(local_cluster, tmp_path):
    model = prompted_minilm(tmp_path)
    records = [{"id": f"t{i}", "text": text} for i, text in enumerate(FIXTURE["texts"])]
    corpus = write_corpus(tmp_path / "texts.jsonl", records)
    out = tmp_path / "ubinary"
    report = local_cluster.embed_job(
        str(corpus), model, str(out), replicas=1, prompt="", precision="ubinary",
        truncate_dim=128, normalize=True, progress=False,
    )
    assert report["dimension"] == 128 and report["dtype"] == "ubinary"
    packed = np.load(out / "embeddings.npy")
    assert packed.dtype == np.uint8 and packed.shape == (len(records), 16)
    theirs = np.packbits(np.asarray(FIXTURE["vectors"]["truncate_128_normalized"]) > 0, axis=-1)
    differing = np.unpackbits(packed ^ theirs).sum()
    assert differing <= len(records) * 128 // 200, differing

    out = tmp_path / "int8"
    local_cluster.embed_job(str(corpus), model, str(out), replicas=1, prompt="", precision="int8",
                            progress=False)
    index = json.loads((out / "index.json").read_text())
    assert index["dtype"] == "int8" and index["quantization_ranges"]["sample_rows"] == len(records)
    ours = np.load(out / "embeddings.npy").astype(np.int32)
    theirs = np.asarray(FIXTURE["quantized_from_none"]["int8"], dtype=np.int32)
    assert np.abs(ours - theirs).max() <= 1 and (ours == theirs).mean() >= 0.99
    with pytest.raises(resident.BadInput, match="precision `int4`"):
        local_cluster.embed_job(str(corpus), model, str(tmp_path / "bad"), precision="int4",
                                progress=False)


def test_embed_job_writes_parquet_with_the_kept_columns(local_cluster, tmp_path):
    records = [
        {"id": f"t{i}", "text": text, "title": f"T{i}"} for i, text in enumerate(FIXTURE["texts"])
    ]
    corpus = write_corpus(tmp_path / "titled.jsonl", records)
    out = tmp_path / "parquet"
    report = local_cluster.embed_job(
        str(corpus), str(MINILM), str(out), replicas=1, format="parquet",
        keep_columns=["title", "text=passage"], precision="float16", progress=False,
    )
    assert report["items"] == len(records)
    index = json.loads((out / "index.json").read_text())
    assert index["merged"]["vectors"] == "embeddings.parquet"
    data = (out / "embeddings.parquet").read_bytes()
    assert data[:4] == b"PAR1" and data[-4:] == b"PAR1"
    assert b"title" in data and b"embedding" in data
    import pyarrow.parquet as pq

    table = pq.read_table(out / "embeddings.parquet")
    assert table.column_names == ["id", "embedding", "title", "passage"]
    assert table.column("passage").to_pylist() == [record["text"] for record in records]
    with pytest.raises(resident.BadInput, match="format `csv`"):
        local_cluster.embed_job(str(corpus), str(MINILM), str(tmp_path / "bad"), format="csv",
                                progress=False)


def test_embed_quantises_and_truncates_as_sentence_transformers(local_cluster, tmp_path):
    model = prompted_minilm(tmp_path)
    texts = FIXTURE["texts"]
    for precision, theirs in FIXTURE["quantized_from_none"].items():
        ours = local_cluster.embed(texts, model, replicas=1, prompt="", precision=precision,
                                   progress=False)
        theirs = np.asarray(theirs)
        assert ours.shape == theirs.shape and ours.dtype == np.dtype(
            "uint8" if precision.startswith("u") else "int8"), (precision, ours.dtype)
        # Our floats differ from torch's in the last bits: a value on a bucket's edge (or a
        # sign bit of a value near 0) may land one bucket away, rarely.
        differ = np.abs(ours.astype(int) - theirs.astype(int))
        assert (differ == 0).mean() >= 0.97, (precision, (differ == 0).mean())
        if precision in ("int8", "uint8"):
            assert differ.max() <= 1, precision
    short = local_cluster.embed(texts, model, replicas=1, prompt="", truncate_dim=128,
                                normalize=True, progress=False)
    none = np.asarray(FIXTURE["vectors"]["none"], dtype=np.float32)[:, :128]
    none /= np.linalg.norm(none, axis=1, keepdims=True)
    assert short.shape == (len(texts), 128)
    assert cosines(short, none).min() >= 0.9999
    half = next(local_cluster.embed_iter(texts, model, replicas=1, precision="float16",
                                         progress=False))
    assert half.dtype == np.float16
    with pytest.raises(resident.BadInput, match="embed_iter cannot quantise to int8"):
        next(local_cluster.embed_iter(texts, model, replicas=1, precision="int8", progress=False))
    with pytest.raises(resident.BadInput, match="precision 'int4' is not one of"):
        local_cluster.embed(texts, model, precision="int4", progress=False)
