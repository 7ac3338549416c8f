# Type stubs of output.py (stubgen --include-docstrings, as __init__.pyi).
import numpy as np
from _typeshed import Incomplete
from collections.abc import Iterator
from typing import Any

__all__ = ['VECTOR_COLUMN', 'read_embeddings', 'Embeddings']

VECTOR_COLUMN: str

def read_embeddings(path: str) -> Embeddings:
    '''Opens the output directory of ``resident embed`` (or ``embed_job``): npy or Parquet,
    merged or shards only, without reading the vectors yet.

    >>> out = resident.read_embeddings("out/wiki")
    >>> out.vectors.shape            # a memory map of embeddings.npy: nothing read yet
    (10033, 384)
    >>> for vectors, records in out.iter_batches(65536): ...

    ``s3://`` outputs are not read directly yet: copy them first (``aws s3 sync``).
    '''

class Embeddings:
    """An embedding output: its vectors, each row's record fields (``id``, the carried
    columns, and ``doc_id``/``window``/``char_start``/``char_end`` for windows), and its
    ``index.json``."""
    path: Incomplete
    index: Incomplete
    format: Incomplete
    def __init__(self, path: str, index: dict) -> None: ...
    @property
    def rows(self) -> int:
        """Rows of the output (windows, with ``--split``)."""
    @property
    def dim(self) -> int:
        """Dimensions per vector (bits, for the binary precisions)."""
    def __len__(self) -> int: ...
    @property
    def vectors(self) -> np.ndarray:
        """Every vector, ``(rows, stored width)``, in input order: a read-only memory map of
        ``embeddings.npy`` when merged (pages are read as they are touched); otherwise read
        shard by shard into memory (Parquet: only the vector column)."""
    def records(self) -> list[dict]:
        """Each row's fields besides its vector, in input order."""
    def iter_batches(self, batch_size: int = 65536) -> Iterator[tuple[np.ndarray, list[dict]]]:
        """Yields ``(vectors, records)`` of at most ``batch_size`` rows, in input order,
        holding one batch (and one shard's ids) at a time."""
    def to_arrow(self) -> Any:
        """The output as a pyarrow Table (Parquet: memory-mapped; npy: built in memory), with
        the vectors as a fixed-size list column ``embedding``."""
