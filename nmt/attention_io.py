"""Attention matrices of translated lines: JSON lines or .npz files, and heat-map PNGs.

One record per input line, in input order, for its best hypothesis: `index` (the line, counted from 0),
`src` (the source subword pieces, then </s>), `tgt` (the output pieces, then </s> when the output ended
with EOS) and `attention`, one row per output step and one column per source piece (each row sums to 1).
A blank line gives empty lists. In a .npz file the record of line I is the arrays attn_I, src_I and tgt_I.
"""

from __future__ import annotations

import json
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import numpy as np

from nmt.data.tokenizer import Tokenizer
from nmt.errors import NmtError
from nmt.evaluation.plots import plot_attention
from nmt.fileio import atomic_open
from nmt.translation import Translation

END = "</s>"


@dataclass
class AttentionRecord:
    index: int
    src: list[str]
    tgt: list[str]
    attention: np.ndarray  # (steps, source pieces)


def attention_record(index: int, result: Translation, tokenizer: Tokenizer) -> AttentionRecord:
    """The best hypothesis' attention with the pieces that label its rows and columns."""
    if not result.hyps:
        return AttentionRecord(index, [], [], np.zeros((0, 0), dtype=np.float32))
    best = result.hyps[0]
    attention = best.attention.float().numpy()
    src = [tokenizer.src.id_to_piece(i) for i in result.src_ids] + [END]
    tgt = ([tokenizer.tgt.id_to_piece(i) for i in best.tokens] + [END])[: attention.shape[0]]
    return AttentionRecord(index, src, tgt, attention)


class JsonLinesWriter:
    """One JSON object per line: {"index", "src", "tgt", "attention"} (weights rounded to 4 decimals)."""

    def __init__(self, f: IO[str]):
        self.f = f

    def write(self, record: AttentionRecord) -> None:
        rows = np.round(record.attention.astype(np.float64), 4).tolist()
        fields = {"index": record.index, "src": record.src, "tgt": record.tgt, "attention": rows}
        self.f.write(json.dumps(fields, ensure_ascii=False) + "\n")

    def close(self) -> None:
        pass


class NpzWriter:
    """A .npz archive (numpy.load reads it) written member by member, so it never sits in memory whole."""

    def __init__(self, f: IO[bytes]):
        self.zip = zipfile.ZipFile(f, "w", compression=zipfile.ZIP_DEFLATED)

    def write(self, record: AttentionRecord) -> None:
        arrays = {
            "attn": record.attention,
            "src": np.array(record.src, dtype=np.str_),
            "tgt": np.array(record.tgt, dtype=np.str_),
        }
        for name, array in arrays.items():
            with self.zip.open(f"{name}_{record.index}.npy", "w", force_zip64=True) as member:
                np.lib.format.write_array(member, array, allow_pickle=False)

    def close(self) -> None:
        self.zip.close()


@contextmanager
def attention_writer(path: str | Path) -> Iterator[JsonLinesWriter | NpzWriter]:
    """A writer for attention_out=PATH: .npz, else JSON lines; the file appears only when all went well."""
    npz = str(path).lower().endswith(".npz")
    with atomic_open(path, "wb" if npz else "w", key="attention_out") as f:
        writer = NpzWriter(f) if npz else JsonLinesWriter(f)
        yield writer
        writer.close()


class HeatMaps:
    """PNG heat-maps DIR/INDEX.png of the first `limit` non-blank lines."""

    def __init__(self, folder: str | Path, limit: int):
        self.folder, self.left = Path(folder), limit
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise NmtError(f"plot_dir={folder}: cannot create the folder ({err.strerror or err})") from None

    def write(self, record: AttentionRecord) -> None:
        if self.left > 0 and record.src:
            self.left -= 1
            plot_attention(
                record.attention,
                record.src,
                record.tgt,
                self.folder / f"{record.index:06d}.png",
                f"line index {record.index}",
            )
