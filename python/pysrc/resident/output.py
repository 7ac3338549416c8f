"""Reading what ``resident embed`` wrote: :func:`read_embeddings`."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import numpy as np

from .errors import BadInput

#: The Parquet column that holds the vectors.
VECTOR_COLUMN = "embedding"
#: The fields a window's row has besides its id (``resident embed --split``).
WINDOW_FIELDS = ("doc_id", "window", "char_start", "char_end")


def _as_text(name: str, value: Any) -> Any:
    """A field's value as the Parquet output stores it: window numbers as they are, strings
    and nulls as they are, anything else as its JSON."""
    if name in WINDOW_FIELDS[1:] or value is None or isinstance(value, str):
        return value
    return json.dumps(value, separators=(",", ":"))


def read_embeddings(path: str) -> "Embeddings":
    """Opens the output directory of ``resident embed`` (or ``embed_job``): npy or Parquet,
    merged or shards only, without reading the vectors yet.

    >>> out = resident.read_embeddings("out/wiki")
    >>> out.vectors.shape            # a memory map of embeddings.npy: nothing read yet
    (10033, 384)
    >>> for vectors, records in out.iter_batches(65536): ...

    ``s3://`` outputs are not read directly yet: copy them first (``aws s3 sync``).
    """
    if str(path).startswith("s3://"):
        raise BadInput(
            f"{path}: read_embeddings reads local outputs; copy it first "
            "(aws s3 sync s3://... ./out) and read the copy",
            "BadInput",
        )
    index_path = os.path.join(path, "index.json")
    try:
        with open(index_path, encoding="utf-8") as file:
            index = json.load(file)
    except FileNotFoundError:
        raise BadInput(
            f"{path} has no index.json: it is not a finished resident embed output "
            "(a job still running, or one that failed, writes it at its end)",
            "BadInput",
        ) from None
    if index.get("format") != "resident-embeddings":
        raise BadInput(f"{index_path} describes {index.get('format')!r}, not embeddings", "BadInput")
    return Embeddings(path, index)


class Embeddings:
    """An embedding output: its vectors, each row's record fields (``id``, the carried
    columns, and ``doc_id``/``window``/``char_start``/``char_end`` for windows), and its
    ``index.json``."""

    def __init__(self, path: str, index: dict) -> None:
        self.path = path
        #: ``index.json``: rows, dim, dtype, the merged files, the shards, and the int8
        #: ``quantization_ranges`` when the precision has them.
        self.index = index
        merged = index.get("merged") or {}
        vectors_file = merged.get("vectors") or (
            index["shards"][0]["vectors_file"] if index.get("shards") else "embeddings.npy"
        )
        #: ``"npy"`` or ``"parquet"``.
        self.format = "parquet" if vectors_file.endswith(".parquet") else "npy"
        self._merged = merged

    @property
    def rows(self) -> int:
        """Rows of the output (windows, with ``--split``)."""
        return int(self.index["rows"])

    @property
    def dim(self) -> int:
        """Dimensions per vector (bits, for the binary precisions)."""
        return int(self.index["dim"])

    def __len__(self) -> int:
        return self.rows

    def _file(self, name: str) -> str:
        return os.path.join(self.path, name)

    def _shards(self) -> list[dict]:
        return sorted(self.index.get("shards", []), key=lambda s: s["index"])

    @property
    def vectors(self) -> np.ndarray:
        """Every vector, ``(rows, stored width)``, in input order: a read-only memory map of
        ``embeddings.npy`` when merged (pages are read as they are touched); otherwise read
        shard by shard into memory (Parquet: only the vector column)."""
        if self.format == "npy" and "vectors" in self._merged:
            return np.load(self._file(self._merged["vectors"]), mmap_mode="r")
        blocks = [vectors for vectors, _ in self.iter_batches()]
        if not blocks:
            return np.zeros((0, self.dim), dtype=np.float32)
        return np.concatenate(blocks)

    def records(self) -> list[dict]:
        """Each row's fields besides its vector, in input order."""
        return [record for _, records in self.iter_batches() for record in records]

    def iter_batches(self, batch_size: int = 65536) -> Iterator[tuple[np.ndarray, list[dict]]]:
        """Yields ``(vectors, records)`` of at most ``batch_size`` rows, in input order,
        holding one batch (and one shard's ids) at a time."""
        if batch_size < 1:
            raise BadInput("batch_size must be at least 1", "BadInput")
        if self.format == "parquet":
            yield from self._parquet_batches(batch_size)
        else:
            yield from self._npy_batches(batch_size)

    def _npy_batches(self, batch_size: int) -> Iterator[tuple[np.ndarray, list[dict]]]:
        if "vectors" in self._merged and "ids" in self._merged:
            vectors = np.load(self._file(self._merged["vectors"]), mmap_mode="r")
            with open(self._file(self._merged["ids"]), encoding="utf-8") as ids:
                start = 0
                while start < len(vectors):
                    records = [json.loads(next(ids)) for _ in range(min(batch_size, len(vectors) - start))]
                    yield np.array(vectors[start : start + len(records)]), records
                    start += len(records)
            return
        for shard in self._shards():
            vectors = np.load(self._file(shard["vectors_file"]), mmap_mode="r")
            with open(self._file(shard["ids_file"]), encoding="utf-8") as ids:
                records = [json.loads(line) for line in ids]
            for start in range(0, len(records), batch_size):
                yield np.array(vectors[start : start + batch_size]), records[start : start + batch_size]

    def _parquet_batches(self, batch_size: int) -> Iterator[tuple[np.ndarray, list[dict]]]:
        import pyarrow.parquet as pq

        files = (
            [self._merged["vectors"]]
            if "vectors" in self._merged
            else [shard["vectors_file"] for shard in self._shards()]
        )
        for name in files:
            for batch in pq.ParquetFile(self._file(name)).iter_batches(batch_size=batch_size):
                column = batch.column(VECTOR_COLUMN)
                width = column.type.list_size
                flat = column.flatten().to_numpy(zero_copy_only=False)
                vectors = flat.reshape(len(batch), width)
                others = batch.select([n for n in batch.schema.names if n != VECTOR_COLUMN])
                yield vectors, others.to_pylist()

    def to_arrow(self) -> Any:
        """The output as a pyarrow Table (Parquet: memory-mapped; npy: built in memory), with
        the vectors as a fixed-size list column ``embedding``."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        if self.format == "parquet" and "vectors" in self._merged:
            return pq.read_table(self._file(self._merged["vectors"]), memory_map=True)
        tables = []
        for vectors, records in self.iter_batches():
            # As the Parquet output has them: ids and carried fields as text (JSON for
            # what is not a string), window numbers as integers; `embedding` second.
            rows = [{k: _as_text(k, v) for k, v in record.items()} for record in records]
            names = ["id"] + sorted(
                {k for row in rows for k in row} - {"id", *WINDOW_FIELDS},
            ) + [k for k in WINDOW_FIELDS if rows and k in rows[0]]
            table = pa.Table.from_pylist(rows).select(names)
            flat = pa.array(np.ascontiguousarray(vectors).reshape(-1))
            tables.append(
                table.add_column(1, VECTOR_COLUMN, pa.FixedSizeListArray.from_arrays(flat, vectors.shape[1]))
            )
        return pa.concat_tables(tables) if tables else pa.table({})

    def __repr__(self) -> str:
        return f"resident.Embeddings({self.path!r}, rows={self.rows}, dim={self.dim}, format={self.format!r})"


__all__ = ["read_embeddings", "Embeddings", "VECTOR_COLUMN"]
