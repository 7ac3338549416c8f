"""Python for data work against a real local cluster: pandas and Arrow in and out,
``embed_frame``, the streaming ``embed_iter``, windows, ``read_embeddings`` over npy and
Parquet outputs, and no change to the process's environment."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import resident
from conftest import MINILM, REPO, wiki_texts, write_corpus


@pytest.fixture(scope="module")
def texts() -> list[str]:
    return [record["text"] for record in wiki_texts(300)]


@pytest.fixture(scope="module")
def reference(local_cluster, texts) -> np.ndarray:
    return local_cluster.embed(texts, str(MINILM), progress=False)


def test_a_series_an_arrow_column_and_frames_embed_as_the_list_does(local_cluster, texts, reference):
    model = str(MINILM)
    series = local_cluster.embed(pd.Series(texts), model, progress=False)
    assert np.array_equal(series, reference)
    chunked = pa.chunked_array([texts[:100], texts[100:]])
    assert np.array_equal(local_cluster.embed(chunked, model, progress=False), reference)

    frame = pd.DataFrame({"body": texts, "n": range(len(texts))})
    embedded = local_cluster.embed_frame(frame, model, column="body", progress=False)
    assert list(embedded.columns) == ["body", "n", "embedding"]
    assert "embedding" not in frame.columns, "the caller's frame is left as it was"
    assert np.array_equal(np.stack(embedded["embedding"].to_list()), reference)

    table = pa.table({"body": texts})
    with_vectors = local_cluster.embed_frame(table, model, column="body", progress=False)
    assert with_vectors.schema.field("embedding").type == pa.list_(pa.float32(), 384)
    column = with_vectors.column("embedding").combine_chunks()
    assert np.array_equal(column.flatten().to_numpy().reshape(-1, 384), reference)

    with pytest.raises(resident.BadInput, match="no column 'text' to embed: the frame has body, n"):
        local_cluster.embed_frame(frame, model, progress=False)
    with pytest.raises(resident.BadInput, match="text 1 is missing"):
        local_cluster.embed(pd.Series(["a text", None]), model, progress=False)


def test_embed_iter_streams_in_order_and_keeps_every_actor_busy(local_cluster, texts, reference):
    model = str(MINILM)
    pulled = []

    def source():
        for i, text in enumerate(texts):
            pulled.append(i)
            yield text

    blocks = []
    stream = local_cluster.embed_iter(source(), model, chunk_size=10, progress=False)
    for block in stream:
        # Never read more than the chunks in flight ahead of what came back.
        done = sum(len(b) for b in blocks) + len(block)
        assert len(pulled) - done <= 10 * (2 * 2 + 1), (len(pulled), done)
        blocks.append(block)
    assert [len(b) for b in blocks] == [10] * 30
    assert np.array_equal(np.concatenate(blocks), reference)
    block = blocks[0]
    block[0, 0] = 1.0  # the arrays are the caller's to change
    pool = [p for p in local_cluster.pools() if p.name.startswith("py-embed")]
    actors = [a for a in local_cluster.actors() if a.pool == pool[0].name]
    assert len(actors) >= 2 and all(a.tasks_done > 0 for a in actors), actors

    # Stopping early cancels the rest; the next call works.
    first = next(iter(local_cluster.embed_iter(iter(texts), model, chunk_size=5, progress=False)))
    assert first.shape == (5, 384)
    again = local_cluster.embed(texts[:7], model, progress=False)
    assert np.array_equal(again, reference[:7])


def test_long_texts_in_windows_from_python(local_cluster, tmp_path):
    model = str(MINILM)
    long = " ".join(["the river runs past the city and the school"] * 120)
    pooled = local_cluster.embed([long, "short"], model, split="tokens:64:8", progress=False)
    cut = local_cluster.embed([long, "short"], model, progress=False)
    assert pooled.shape == (2, 384)
    assert np.allclose(np.linalg.norm(pooled, axis=1), 1.0, atol=1e-5)
    assert np.allclose(pooled[1], cut[1], atol=1e-6), "a short text is one window"
    assert not np.allclose(pooled[0], cut[0], atol=1e-3), "the long one is not cut off"

    records = [{"id": "long", "text": long, "title": "Long"}, {"id": 2, "text": "short", "title": "S"}]
    corpus = write_corpus(tmp_path / "corpus.jsonl", records)
    out = tmp_path / "windows"
    report = local_cluster.embed_job(
        str(corpus), model, str(out), split="tokens:64:8", keep_columns=["title"],
        format="parquet", progress=False,
    )
    windows = report["windows"]["windows"]
    assert report["items"] == 2 and windows > 10 and report["windows"]["documents_split"] == 1
    table = pq.read_table(out / "embeddings.parquet")
    assert table.num_rows == windows
    assert table.column("id").to_pylist()[:2] == ["long#0", "long#1"]
    assert table.column("doc_id").to_pylist()[-1] == "2"

    read = resident.read_embeddings(str(out))
    assert (read.format, read.rows, read.dim) == ("parquet", windows, 384)
    records_read = read.records()
    assert records_read[-1] == {"id": "2#0", "title": "S", "doc_id": "2", "window": 0,
                                "char_start": 0, "char_end": 5}
    assert np.array_equal(read.vectors, table.column("embedding").combine_chunks().flatten()
                          .to_numpy().reshape(-1, 384))
    with pytest.raises(resident.BadInput, match="pool_windows needs split="):
        local_cluster.embed_job(str(corpus), model, str(tmp_path / "x"), pool_windows="mean",
                                progress=False)


def test_read_embeddings_opens_npy_outputs_merged_or_not_without_loading_them(local_cluster, tmp_path):
    model = str(MINILM)
    records = [{**r, "title": f"title {i}"} for i, r in enumerate(wiki_texts(120))]
    corpus = write_corpus(tmp_path / "wiki.jsonl", records)
    merged_out, shards_out = tmp_path / "merged", tmp_path / "shards"
    local_cluster.embed_job(str(corpus), model, str(merged_out), chunk_size=50,
                            keep_columns=["title"], progress=False)
    local_cluster.embed_job(str(corpus), model, str(shards_out), chunk_size=50, merge=False,
                            keep_columns=["title"], progress=False)
    merged = resident.read_embeddings(str(merged_out))
    assert isinstance(merged.vectors, np.memmap), "a merged npy is mapped, not read"
    expected = np.load(merged_out / "embeddings.npy")
    assert np.array_equal(merged.vectors, expected)
    ids = [json.loads(line) for line in (merged_out / "ids.jsonl").read_text().splitlines()]
    assert merged.records() == ids
    assert ids[0] == {"id": records[0]["id"], "title": records[0]["title"]}

    shards = resident.read_embeddings(str(shards_out))
    assert not (shards_out / "embeddings.npy").exists()
    batches = list(shards.iter_batches(batch_size=32))
    assert max(len(r) for _, r in batches) == 32
    assert np.array_equal(np.concatenate([v for v, _ in batches]), expected)
    assert [r for _, rs in batches for r in rs] == ids

    table = merged.to_arrow()
    assert table.schema.names == ["id", "embedding", "title"]
    assert np.array_equal(table.column("embedding").combine_chunks().flatten().to_numpy()
                          .reshape(-1, 384), expected)
    with pytest.raises(resident.BadInput, match="no index.json"):
        resident.read_embeddings(str(tmp_path))


def test_local_leaves_the_environment_as_it_was():
    code = (
        "import os, resident\n"
        "before = dict(os.environ)\n"
        "cluster = resident.local()\n"
        f"cluster.embed(['one text'], {str(MINILM)!r}, progress=False)\n"
        "cluster.close()\n"
        "assert dict(os.environ) == before, set(os.environ.items()) ^ set(before.items())\n"
        "print('same')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "RAYON_NUM_THREADS"}
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "same" in done.stdout, done.stderr


def test_an_s3_output_is_written_with_s3_endpoint_and_read_back_in_ranges(local_cluster, s3_server, tmp_path):
    model = str(MINILM)
    records = [{**r, "title": f"title {i}"} for i, r in enumerate(wiki_texts(90))]
    corpus = write_corpus(tmp_path / "wiki.jsonl", records)
    local_out = tmp_path / "local"
    local_cluster.embed_job(str(corpus), model, str(local_out), chunk_size=40,
                            keep_columns=["title"], progress=False)
    expected = resident.read_embeddings(str(local_out))
    for format in ("npy", "parquet"):
        where = f"s3://out/{format}"
        report = local_cluster.embed_job(str(corpus), model, where, chunk_size=40,
                                         keep_columns=["title"], format=format,
                                         s3_endpoint=s3_server, progress=False)
        assert report["items"] == 90
        read = resident.read_embeddings(where, s3_endpoint=s3_server)
        assert (read.format, read.rows) == (format, 90)
        batches = list(read.iter_batches(batch_size=25))
        assert [len(r) for _, r in batches] == [25, 25, 25, 15]
        vectors = np.concatenate([v for v, _ in batches])
        assert np.array_equal(vectors, expected.vectors), format
        titles = [r["title"] for _, rs in batches for r in rs]
        assert titles == [r["title"] for r in records]
    with pytest.raises(resident.BadInput, match="has no index.json"):
        resident.read_embeddings("s3://out/nothing-here", s3_endpoint=s3_server)
