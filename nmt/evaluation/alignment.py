"""Word alignments read off attention, scored against gold alignments: AER, precision and recall.

Gold alignments are Pharaoh lines, one per sentence pair: `i-j` is a sure link between source word i
and target word j (0-based, words split at whitespace), `i?j` a possible one. Sure links are possible
too (S is a subset of P). For predicted links A, summed over the corpus (Och & Ney 2003, sec. 4.1):

    precision = |A & P| / |A|
    recall    = |A & S| / |S|
    AER       = 1 - (|A & S| + |A & P|) / (|A| + |S|)

Attention is over subword pieces; a word's row is the mean of its pieces' rows and a word's column the
sum of its pieces' columns, so a target word's row is still a distribution over source words. Each
target word is linked to the source word it attends to most (argmax; the </s> column is left out).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from nmt.data.corpus import read_lines
from nmt.errors import NmtError

WORD_START = "\u2581"  # SentencePiece's mark of a piece that begins a word
LINK = re.compile(r"(\d+)([-?])(\d+)")

Link = tuple[int, int]  # (source word, target word)


@dataclass
class GoldAlignment:
    sure: set[Link]
    possible: set[Link]  # holds the sure links too


def parse_pharaoh(line: str, where: str) -> GoldAlignment:
    """One Pharaoh line: `0-0 1-2 2?1`; a malformed link is an error naming `where` (FILE:LINE)."""
    sure: set[Link] = set()
    possible: set[Link] = set()
    for token in line.split():
        match = LINK.fullmatch(token)
        if match is None:
            raise NmtError(
                f"{where}: '{token}' is not an alignment link; expected i-j (sure) or i?j (possible), "
                "0-based word indices"
            )
        link = (int(match.group(1)), int(match.group(3)))
        possible.add(link)
        if match.group(2) == "-":
            sure.add(link)
    return GoldAlignment(sure, possible)


def read_pharaoh(path: str | Path, src: list[str], tgt: list[str]) -> list[GoldAlignment]:
    """A Pharaoh file for the sentence pairs (src[k], tgt[k]); its lines and links must fit them."""
    lines = read_lines(str(path))
    if len(lines) != len(src):
        raise NmtError(
            f"align={path}: {len(lines)} lines, but the test set has {len(src)} sentence pairs; "
            "expected one line per pair"
        )
    gold = []
    for k, (line, s, t) in enumerate(zip(lines, src, tgt)):
        alignment = parse_pharaoh(line, f"{path}:{k + 1}")
        n_src, n_tgt = len(s.split()), len(t.split())
        if bad := [f"{i}-{j}" for i, j in sorted(alignment.possible) if i >= n_src or j >= n_tgt]:
            flipped = all(j < n_src and i < n_tgt for i, j in alignment.possible)
            hint = "; the links fit the other way round: is the file target-source?" if flipped else ""
            raise NmtError(
                f"{path}:{k + 1}: link {bad[0]} points past the sentence pair ({n_src} source words, {n_tgt} target "
                f"words); expected source-target links i-j, 0-based{hint}"
            )
        gold.append(alignment)
    return gold


def word_index(pieces: list[str]) -> list[int]:
    """The word each SentencePiece piece belongs to: a piece starting with U+2581 starts a new word."""
    words, current = [], -1
    for piece in pieces:
        if piece.startswith(WORD_START) or current < 0:
            current += 1
        words.append(current)
    return words


def merge_to_words(attention: np.ndarray, src_words: list[int], tgt_words: list[int]) -> np.ndarray:
    """Piece attention (T pieces, S pieces) -> word attention (target words, source words).

    A target word's row is the mean of its pieces' rows; a source word's column the sum of its pieces' columns.
    """
    attention = attention[: len(tgt_words), : len(src_words)]
    n_tgt, n_src = max(tgt_words, default=-1) + 1, max(src_words, default=-1) + 1
    rows = np.zeros((n_tgt, attention.shape[1]))
    np.add.at(rows, tgt_words, attention)
    rows /= np.bincount(tgt_words, minlength=n_tgt)[:, None]
    words = np.zeros((n_tgt, n_src))
    np.add.at(words.T, src_words, rows.T)
    return words


def argmax_links(word_attention: np.ndarray) -> set[Link]:
    """Each target word j linked to the source word i it attends to most: {(i, j)}."""
    if word_attention.size == 0:
        return set()
    return {(int(i), j) for j, i in enumerate(word_attention.argmax(1))}


@dataclass
class AlignmentScore:
    """Link counts summed over a corpus; precision, recall and AER follow from them."""

    predicted: int = 0  # |A|
    sure: int = 0  # |S|
    hit_sure: int = 0  # |A & S|
    hit_possible: int = 0  # |A & P|
    sentences: int = 0

    def add(self, predicted: set[Link], gold: GoldAlignment) -> None:
        self.predicted += len(predicted)
        self.sure += len(gold.sure)
        self.hit_sure += len(predicted & gold.sure)
        self.hit_possible += len(predicted & gold.possible)
        self.sentences += 1

    @property
    def precision(self) -> float:
        return self.hit_possible / self.predicted if self.predicted else 0.0

    @property
    def recall(self) -> float:
        return self.hit_sure / self.sure if self.sure else 0.0

    @property
    def aer(self) -> float:
        total = self.predicted + self.sure
        return 1.0 - (self.hit_sure + self.hit_possible) / total if total else 0.0

    def as_dict(self) -> dict[str, float | int]:
        return {
            "aer": self.aer,
            "precision": self.precision,
            "recall": self.recall,
            "links": self.predicted,
            "gold_sure": self.sure,
            "sentences": self.sentences,
        }
