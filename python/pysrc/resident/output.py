"""Reading what ``resident embed`` wrote: :func:`read_embeddings`."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any, BinaryIO, Optional

import numpy as np

from .errors import BadInput

#: The Parquet column that holds the vectors.
VECTOR_COLUMN = "embedding"
#: The fields a window's row has besides its id (``resident embed --split``).
WINDOW_FIELDS = ("doc_id", "window", "char_start", "char_end")
#: Bytes read at a time from an ids file.
_READ_BLOCK = 1 << 20


def _as_text(name: str, value: Any) -> Any:
    """A field's value as the Parquet output stores it: window numbers as they are, strings
    and nulls as they are, anything else as its JSON."""
    if name in WINDOW_FIELDS[1:] or value is None or isinstance(value, str):
        return value
    return json.dumps(value, separators=(",", ":"))


class _Files:
    """The files of an output: a local directory, or an ``s3://bucket/prefix`` read through
    pyarrow's S3 filesystem (the standard AWS credential chain; ``s3_endpoint``,
    ``RESIDENT_S3_ENDPOINT`` or ``AWS_ENDPOINT_URL`` for an S3-compatible store)."""

    def __init__(self, path: str, s3_endpoint: Optional[str]) -> None:
        self.path = str(path)
        self.s3 = None
        if self.path.startswith("s3://"):
            from pyarrow import fs

            endpoint = (
                s3_endpoint
                or os.environ.get("RESIDENT_S3_ENDPOINT")
                or os.environ.get("AWS_ENDPOINT_URL")
            )
            options: dict[str, Any] = {"region": os.environ.get("AWS_REGION", "us-east-1")}
            if endpoint:
                scheme, _, host = endpoint.rpartition("://")
                options.update(endpoint_override=host, scheme=scheme or "https")
            self.s3 = fs.S3FileSystem(**options)
            self.root = self.path[len("s3://") :].rstrip("/")
        else:
            self.root = self.path

    def where(self, name: str) -> str:
        return f"{self.root}/{name}" if self.s3 is not None else os.path.join(self.root, name)

    def local(self, name: str) -> Optional[str]:
        """The local path of ``name`` (``None`` on S3)."""
        return None if self.s3 is not None else self.where(name)

    def open(self, name: str) -> BinaryIO:
        """``name`` for random access (seek and read)."""
        if self.s3 is not None:
            return self.s3.open_input_file(self.where(name))
        return open(self.where(name), "rb")

    def read_text(self, name: str) -> str:
        with self.open(name) as file:
            return file.read().decode("utf-8")


def read_embeddings(path: str, *, s3_endpoint: Optional[str] = None) -> "Embeddings":
    """Opens the output of ``resident embed`` (or ``embed_job``), a local directory or an
    ``s3://bucket/prefix``: npy or Parquet, merged or shards only, without reading the
    vectors yet.

    >>> out = resident.read_embeddings("out/wiki")
    >>> out.vectors.shape            # a memory map of embeddings.npy: nothing read yet
    (10033, 384)
    >>> for vectors, records in out.iter_batches(65536): ...

    On S3 (pyarrow's filesystem; ``s3_endpoint`` or ``RESIDENT_S3_ENDPOINT`` for an
    S3-compatible store) batches are read with ranged requests, a batch at a time.
    """
    files = _Files(path, s3_endpoint)
    try:
        index = json.loads(files.read_text("index.json"))
    except (FileNotFoundError, OSError) as error:
        if isinstance(error, FileNotFoundError) or "not found" in str(error).lower() or "NoSuchKey" in str(error):
            raise BadInput(
                f"{path} has no index.json: it is not a finished resident embed output "
                "(a job still running, or one that failed, writes it at its end)",
                "BadInput",
            ) from None
        raise
    if index.get("format") != "resident-embeddings":
        raise BadInput(f"{path}/index.json describes {index.get('format')!r}, not embeddings", "BadInput")
    return Embeddings(files, index)


def _lines(file: BinaryIO) -> Iterator[str]:
    """The lines of a file, read a block at a time."""
    rest = b""
    while True:
        block = file.read(_READ_BLOCK)
        if not block:
            break
        rest += block
        *whole, rest = rest.split(b"\n")
        for line in whole:
            yield line.decode("utf-8")
    if rest:
        yield rest.decode("utf-8")


class _NpyRows:
    """Rows of an ``.npy`` file read by seeking (for files that cannot be memory-mapped)."""

    def __init__(self, file: BinaryIO) -> None:
        version = np.lib.format.read_magic(file)
        if version == (1, 0):
            shape, _, dtype = np.lib.format.read_array_header_1_0(file)
        else:
            shape, _, dtype = np.lib.format.read_array_header_2_0(file)
        self.file, self.shape, self.dtype = file, shape, dtype
        self.start = file.tell()
        self.row_bytes = int(np.prod(shape[1:])) * dtype.itemsize

    def __len__(self) -> int:
        return self.shape[0]

    def read(self, first: int, count: int) -> np.ndarray:
        self.file.seek(self.start + first * self.row_bytes)
        data = self.file.read(count * self.row_bytes)
        return np.frombuffer(data, dtype=self.dtype).reshape((count, *self.shape[1:])).copy()


class Embeddings:
    """An embedding output: its vectors, each row's record fields (``id``, the carried
    columns, and ``doc_id``/``window``/``char_start``/``char_end`` for windows), and its
    ``index.json``."""

    def __init__(self, files: _Files, index: dict) -> None:
        self._files = files
        #: Where it lies: a directory or an ``s3://`` prefix.
        self.path = files.path
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

    def _shards(self) -> list[dict]:
        return sorted(self.index.get("shards", []), key=lambda s: s["index"])

    @property
    def vectors(self) -> np.ndarray:
        """Every vector, ``(rows, stored width)``, in input order: a read-only memory map of a
        local merged ``embeddings.npy`` (pages are read as they are touched); otherwise read
        batch by batch into memory (Parquet: only the vector column)."""
        local = self._files.local(self._merged["vectors"]) if "vectors" in self._merged else None
        if self.format == "npy" and local is not None:
            return np.load(local, mmap_mode="r")
        blocks = [vectors for vectors, _ in self.iter_batches()]
        if not blocks:
            return np.zeros((0, self.dim), dtype=np.float32)
        return np.concatenate(blocks)

    def records(self) -> list[dict]:
        """Each row's fields besides its vector, in input order."""
        return [record for _, records in self.iter_batches() for record in records]

    def iter_batches(self, batch_size: int = 65536) -> Iterator[tuple[np.ndarray, list[dict]]]:
        """Yields ``(vectors, records)`` of at most ``batch_size`` rows, in input order,
        holding one batch at a time."""
        if batch_size < 1:
            raise BadInput("batch_size must be at least 1", "BadInput")
        if self.format == "parquet":
            yield from self._parquet_batches(batch_size)
            return
        pairs = (
            [(self._merged["vectors"], self._merged["ids"])]
            if "vectors" in self._merged and "ids" in self._merged
            else [(shard["vectors_file"], shard["ids_file"]) for shard in self._shards()]
        )
        for vectors_file, ids_file in pairs:
            yield from self._npy_batches(vectors_file, ids_file, batch_size)

    def _npy_batches(
        self, vectors_file: str, ids_file: str, batch_size: int
    ) -> Iterator[tuple[np.ndarray, list[dict]]]:
        with self._files.open(vectors_file) as data, self._files.open(ids_file) as ids:
            rows = _NpyRows(data)
            lines = _lines(ids)
            for first in range(0, len(rows), batch_size):
                count = min(batch_size, len(rows) - first)
                records = [json.loads(next(lines)) for _ in range(count)]
                yield rows.read(first, count), records

    def _parquet_batches(self, batch_size: int) -> Iterator[tuple[np.ndarray, list[dict]]]:
        import pyarrow.parquet as pq

        names = (
            [self._merged["vectors"]]
            if "vectors" in self._merged
            else [shard["vectors_file"] for shard in self._shards()]
        )
        for name in names:
            with self._files.open(name) as file:
                for batch in pq.ParquetFile(file).iter_batches(batch_size=batch_size):
                    column = batch.column(VECTOR_COLUMN)
                    flat = column.flatten().to_numpy(zero_copy_only=False)
                    vectors = flat.reshape(len(batch), column.type.list_size)
                    others = batch.select([n for n in batch.schema.names if n != VECTOR_COLUMN])
                    yield vectors, others.to_pylist()

    def to_arrow(self) -> Any:
        """The output as a pyarrow Table (a local merged Parquet file: memory-mapped; else
        built in memory), with the vectors as a fixed-size list column ``embedding``."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        local = self._files.local(self._merged["vectors"]) if "vectors" in self._merged else None
        if self.format == "parquet" and local is not None:
            return pq.read_table(local, memory_map=True)
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
