"""An encoded split, memory-mapped from the Arrow cache: rows become Python objects only when a batch reads them.

Shapes: B batch, S source length, T target length.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from nmt.data.batching import Batch, rows_batch

ITER_ROWS = 1000  # rows turned into Python objects at a time when a column is iterated


class Column(Sequence):
    """A read-only view of one column of a memory-mapped split: rows become Python objects only when read."""

    def __init__(self, array: pa.ChunkedArray):
        self.array = array

    def __len__(self) -> int:
        return len(self.array)

    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            if step != 1:
                return [self[i] for i in range(start, stop, step)]
            return self.array.slice(start, max(stop - start, 0)).to_pylist()
        position = index + len(self) if index < 0 else index
        if not 0 <= position < len(self):
            raise IndexError(f"row {index} of {len(self)}")
        return self.array[position].as_py()

    def __iter__(self) -> Iterator[Any]:
        for start in range(0, len(self), ITER_ROWS):
            yield from self.array.slice(start, ITER_ROWS).to_pylist()


class Rows:
    """Random access to the rows of a list<int> column through zero-copy views of its Arrow chunks.

    (`ChunkedArray.take` would concatenate the whole column first: a corpus-sized copy per batch.)
    """

    def __init__(self, array: pa.ChunkedArray):
        chunks = [chunk for chunk in array.chunks if len(chunk)]
        self.ends = np.cumsum([len(chunk) for chunk in chunks], dtype=np.int64)  # row index after each chunk
        self.starts = self.ends - [len(chunk) for chunk in chunks]
        self.offsets = [chunk.offsets.to_numpy() for chunk in chunks]  # into the chunk's (unsliced) values
        self.values = [chunk.values.to_numpy() for chunk in chunks]

    def lengths(self) -> np.ndarray:
        """(rows,) the length of every row."""
        return np.concatenate([np.diff(offsets) for offsets in self.offsets]) if self.offsets else np.zeros(0, np.int64)

    def gather(self, indices: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """These rows laid end to end, and their lengths."""
        rows = np.asarray(indices, dtype=np.int64)
        chunk = np.searchsorted(self.ends, rows, side="right")
        pieces = []
        for c, i in zip(chunk.tolist(), (rows - self.starts[chunk]).tolist()):
            offsets = self.offsets[c]
            pieces.append(self.values[c][offsets[i] : offsets[i + 1]])
        lengths = np.array([len(piece) for piece in pieces], dtype=np.int64)
        return (np.concatenate(pieces) if pieces else np.zeros(0, np.int64)), lengths


class EncodedPairs:
    """Source and target rows of subword ids, what batching reads: their lengths, and padded batches of them."""

    def __init__(self, src_rows: Rows, tgt_rows: Rows):
        self.src_rows, self.tgt_rows = src_rows, tgt_rows

    def lengths(self) -> tuple[list[int], list[int]]:
        """Source and target lengths in subword tokens (without EOS/BOS), what batching needs."""
        return self.src_rows.lengths().tolist(), self.tgt_rows.lengths().tolist()

    def batch(self, indices: Sequence[int]) -> Batch:
        """The padded batch of these pairs."""
        return rows_batch(self.src_rows.gather(indices), self.tgt_rows.gather(indices))


class Split(EncodedPairs):
    """One encoded split, memory-mapped from the Arrow cache; the raw text is kept for BLEU references and messages."""

    def __init__(self, ids: Any, text: Any):  # datasets.Dataset: columns src_ids, tgt_ids; and src_text, tgt_text
        self.src_ids, self.tgt_ids = Column(ids.data.column("src_ids")), Column(ids.data.column("tgt_ids"))
        self.src_text, self.tgt_text = Column(text.data.column("src_text")), Column(text.data.column("tgt_text"))
        super().__init__(Rows(self.src_ids.array), Rows(self.tgt_ids.array))

    def __len__(self) -> int:
        return len(self.src_ids)
