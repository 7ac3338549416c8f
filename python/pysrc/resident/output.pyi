# Type stubs of output.py (stubgen --include-docstrings, as __init__.pyi).
import numpy as np
from _typeshed import Incomplete
from collections.abc import Iterator
from typing import Any, BinaryIO

__all__ = ['VECTOR_COLUMN', 'read_embeddings', 'Embeddings']

VECTOR_COLUMN: str

class _Files:
    """The files of an output: a local directory, or an ``s3://bucket/prefix`` read through
    pyarrow's S3 filesystem (the standard AWS credential chain; ``s3_endpoint``,
    ``RESIDENT_S3_ENDPOINT`` or ``AWS_ENDPOINT_URL`` for an S3-compatible store)."""
    path: Incomplete
    s3: Incomplete
    root: Incomplete
    def __init__(self, path: str, s3_endpoint: str | None) -> None: ...
    def where(self, name: str) -> str: ...
    def local(self, name: str) -> str | None:
        """The local path of ``name`` (``None`` on S3)."""
    def open(self, name: str) -> BinaryIO:
        """``name`` for random access (seek and read)."""
    def read_text(self, name: str) -> str: ...

def read_embeddings(path: str, *, s3_endpoint: str | None = None) -> Embeddings:
    '''Opens the output of ``resident embed`` (or ``embed_job``), a local directory or an
    ``s3://bucket/prefix``: npy or Parquet, merged or shards only, without reading the
    vectors yet.

    >>> out = resident.read_embeddings("out/wiki")
    >>> out.vectors.shape            # a memory map of embeddings.npy: nothing read yet
    (10033, 384)
    >>> for vectors, records in out.iter_batches(65536): ...

    On S3 (pyarrow\'s filesystem; ``s3_endpoint`` or ``RESIDENT_S3_ENDPOINT`` for an
    S3-compatible store) batches are read with ranged requests, a batch at a time.
    '''

class _NpyRows:
    """Rows of an ``.npy`` file read by seeking (for files that cannot be memory-mapped)."""
    start: Incomplete
    row_bytes: Incomplete
    def __init__(self, file: BinaryIO) -> None: ...
    def __len__(self) -> int: ...
    def read(self, first: int, count: int) -> np.ndarray: ...

class Embeddings:
    """An embedding output: its vectors, each row's record fields (``id``, the carried
    columns, and ``doc_id``/``window``/``char_start``/``char_end`` for windows), and its
    ``index.json``."""
    path: Incomplete
    index: Incomplete
    format: Incomplete
    def __init__(self, files: _Files, index: dict) -> None: ...
    @property
    def rows(self) -> int:
        """Rows of the output (windows, with ``--split``)."""
    @property
    def dim(self) -> int:
        """Dimensions per vector (bits, for the binary precisions)."""
    def __len__(self) -> int: ...
    @property
    def vectors(self) -> np.ndarray:
        """Every vector, ``(rows, stored width)``, in input order: a read-only memory map of a
        local merged ``embeddings.npy`` (pages are read as they are touched); otherwise read
        batch by batch into memory (Parquet: only the vector column)."""
    def records(self) -> list[dict]:
        """Each row's fields besides its vector, in input order."""
    def iter_batches(self, batch_size: int = 65536) -> Iterator[tuple[np.ndarray, list[dict]]]:
        """Yields ``(vectors, records)`` of at most ``batch_size`` rows, in input order,
        holding one batch at a time."""
    def to_arrow(self) -> Any:
        """The output as a pyarrow Table (a local merged Parquet file: memory-mapped; else
        built in memory), with the vectors as a fixed-size list column ``embedding``."""
