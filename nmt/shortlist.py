"""A vocabulary shortlist (Marian's lexical shortlist, CTranslate2's vocabulary map): per batch, the output layer
scores only a few hundred candidate target tokens instead of the whole vocabulary.

The candidates of a batch are the `frequent` most frequent target tokens, PAD/UNK/BOS/EOS, the tokens a batch's
prefixes and constraints name, and each of its source tokens' likeliest translations, p(target | source) of IBM
Model 1 (Brown et al. 1993) trained by EM on the training corpus (`build`). The search then runs over that small
vocabulary: softmax over the candidates (as Marian and CTranslate2 do), token ids local to the batch, mapped
back at the end (nmt.engine.shortlist: a decoding copy cut to a batch's candidates). The candidates are sorted and
start with the special ids 0..3, so those keep their ids and the search never asks whether a shortlist is on.

The file is CTranslate2's vocabulary map (`vmap.txt`): one line per source piece, `PIECE<TAB>CANDIDATE ...`
(target pieces, likeliest first), and a first line with an empty key listing the tokens always included; so
`nmt-export format=ctranslate2 shortlist=FILE` writes it beside the model as it is.

Shape legend: B batch, S source length, V full target vocabulary, W shortlist (candidates), E the output layer's
input features.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np

from nmt.data.tokenizer import PAD, Tokenizer
from nmt.errors import NmtError
from nmt.fileio import atomic_open

SPECIALS = 4  # PAD, UNK, BOS, EOS: ids 0..3, always candidates (and so keep their ids in the shortlist)


# --- building: IBM Model 1 -------------------------------------------------------------------------------------
def ibm1(
    src: list[list[int]], tgt: list[list[int]], src_vocab: int, tgt_vocab: int, iterations: int = 5
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """IBM Model 1 translation probabilities p(t | s) by EM over sentence pairs of ids (a NULL source word, id
    src_vocab, takes what no source word explains). Returns the observed pairs (s, t) and p(t | s) of each,
    as three arrays of one length (sparse: only pairs that co-occur in some sentence)."""
    rows_s, rows_t, rows_sent = [], [], []
    for k, (s, t) in enumerate(zip(src, tgt)):
        if not t:
            continue
        s_ids = np.asarray(list(s) + [src_vocab], dtype=np.int64)  # + NULL
        t_ids = np.asarray(t, dtype=np.int64)
        rows_s.append(np.tile(s_ids, len(t_ids)))
        rows_t.append(np.repeat(t_ids, len(s_ids)))
        rows_sent.append(np.full(len(s_ids) * len(t_ids), k, dtype=np.int64))
    if not rows_s:
        raise NmtError("shortlist: the corpus has no sentence pair with a target; nothing to learn from")
    s_all, t_all = np.concatenate(rows_s), np.concatenate(rows_t)
    # one id per target position (the normaliser of E-step): runs of len(s)+1 consecutive rows
    position = np.repeat(np.arange(sum(len(t) for t in tgt)), [len(s) + 1 for s, t in zip(src, tgt) for _ in t])
    keys = s_all * tgt_vocab + t_all
    pairs, pair_of = np.unique(keys, return_inverse=True)  # (P,) distinct (s, t); (N,) each row's pair
    pair_s = pairs // tgt_vocab
    prob = np.full(len(pairs), 1.0 / tgt_vocab)
    for _ in range(iterations):
        p = prob[pair_of]  # (N,)
        z = np.bincount(position, weights=p)  # (positions,) sum over the sentence's source words
        counts = np.bincount(pair_of, weights=p / z[position], minlength=len(pairs))  # expected counts c(s, t)
        totals = np.bincount(pair_s, weights=counts, minlength=src_vocab + 1)  # c(s)
        prob = counts / np.maximum(totals[pair_s], 1e-30)
    return pair_s, pairs % tgt_vocab, prob


def build(
    tokenizer: Tokenizer,
    src_lines: list[str],
    tgt_lines: list[str],
    frequent: int = 100,
    per_source: int = 20,
    iterations: int = 5,
) -> dict[str, list[str]]:
    """The vocabulary map: '' -> the `frequent` most frequent target pieces, and each source piece -> its
    `per_source` likeliest translations under IBM Model 1 (pieces, likeliest first)."""
    src, tgt = tokenizer.encode_src(src_lines), tokenizer.encode_tgt(tgt_lines)
    counts = np.bincount(np.concatenate([np.asarray(t, dtype=np.int64) for t in tgt if t]), minlength=4)
    counts[:SPECIALS] = 0
    top = [int(i) for i in np.argsort(-counts, kind="stable")[:frequent] if counts[i] > 0]
    pair_s, pair_t, prob = ibm1(src, tgt, tokenizer.src_vocab_size, tokenizer.tgt_vocab_size, iterations)
    order = np.lexsort((-prob, pair_s))  # by source, likeliest first
    pair_s, pair_t, prob = pair_s[order], pair_t[order], prob[order]
    table: dict[str, list[str]] = {"": [tokenizer.tgt.id_to_piece(i) for i in top]}
    starts = np.flatnonzero(np.r_[True, pair_s[1:] != pair_s[:-1]])
    ends = np.r_[starts[1:], len(pair_s)]
    for a, b in zip(starts, ends):
        s = int(pair_s[a])
        if s < SPECIALS or s >= tokenizer.src_vocab_size:  # specials and NULL have no line
            continue
        targets = [int(t) for t in pair_t[a:b] if t >= SPECIALS][:per_source]
        if targets:
            table[tokenizer.src.id_to_piece(s)] = [tokenizer.tgt.id_to_piece(t) for t in targets]
    return table


def write(table: dict[str, list[str]], path: str | Path, key: str = "out") -> None:
    with atomic_open(Path(path), key=key) as f:
        for source, targets in table.items():
            f.write(f"{source}\t{' '.join(targets)}\n")


# --- reading ----------------------------------------------------------------------------------------------------
class Shortlist:
    """A vocabulary map read against a tokenizer: fixed candidates and, per source id, its candidates' ids."""

    def __init__(self, fixed: list[int], by_source: dict[int, list[int]], tgt_vocab: int):
        self.fixed = sorted(set(range(SPECIALS)) | set(fixed))
        self.by_source = by_source
        self.tgt_vocab = tgt_vocab
        # by_source as a table (source id, k) of candidate ids, short rows padded with PAD (always a candidate):
        # a batch's candidates are one gather and a mask over the vocabulary (0.21 ms a batch of 64 test2016
        # sentences; Python sets took 0.76)
        longest = max((len(ids) for ids in by_source.values()), default=0)
        self._table = np.full((max(by_source, default=-1) + 1, longest), PAD, dtype=np.int64)
        for s, ids in by_source.items():
            self._table[s, : len(ids)] = ids
        self._fixed = np.asarray(self.fixed, dtype=np.int64)

    @classmethod
    def read(cls, path: str, tokenizer: Tokenizer, key: str = "decode.shortlist") -> Shortlist:
        """Read a vocabulary map; a line that is not `PIECE<TAB>PIECES` or names a piece the model's vocabulary lacks
        is an error naming the file and line."""
        file = Path(path)
        if not file.is_file():
            raise NmtError(f"{key}={path}: no such file; build one with nmt-shortlist checkpoint=RUN out={path}")
        fixed: list[int] = []
        by_source: dict[int, list[int]] = {}
        src_unk, tgt_unk = tokenizer.src.unk_id(), tokenizer.tgt.unk_id()
        with open(file, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                line = line.rstrip("\n")
                if not line.strip():
                    continue
                if "\t" not in line:
                    raise NmtError(f"{path}:{number}: expected SOURCE_PIECE<TAB>TARGET_PIECES (a vocabulary map)")
                source, _, targets = line.partition("\t")
                ids = []
                for piece in targets.split():
                    i = tokenizer.tgt.piece_to_id(piece)
                    if i == tgt_unk and piece != tokenizer.tgt.id_to_piece(tgt_unk):
                        raise NmtError(
                            f"{path}:{number}: '{piece}' is not in the model's target vocabulary; "
                            "was the shortlist built for another model?"
                        )
                    ids.append(i)
                if source == "":
                    fixed.extend(ids)
                    continue
                if " " in source:
                    continue  # n-gram keys (CTranslate2 allows them): unigrams cover their tokens already
                s = tokenizer.src.piece_to_id(source)
                if s == src_unk and source != tokenizer.src.id_to_piece(src_unk):
                    raise NmtError(
                        f"{path}:{number}: '{source}' is not in the model's source vocabulary; "
                        "was the shortlist built for another model?"
                    )
                by_source[s] = ids
        return cls(fixed, by_source, tokenizer.tgt_vocab_size)

    def candidates(self, src_ids: Iterable[Iterable[int]], extra: Iterable[int] = ()) -> list[int]:
        """The sorted candidate ids of a batch: the fixed ones, each source token's, and `extra` (prefix and
        constraint tokens)."""
        mark = np.zeros(self.tgt_vocab, dtype=bool)  # (V,)
        mark[self._fixed] = True
        ids = np.fromiter((s for sentence in src_ids for s in sentence), dtype=np.int64)
        mark[self._table[ids[(ids >= 0) & (ids < len(self._table))]]] = True
        mark[np.fromiter(extra, dtype=np.int64)] = True
        return np.flatnonzero(mark).tolist()


_READ: dict[tuple, Shortlist] = {}


def read_shortlist(path: str, tokenizer: Tokenizer) -> Shortlist:
    """Shortlist.read, once per file version and tokenizer (a Translator is made per API call)."""
    try:
        stat = Path(path).stat()
        key = (
            str(Path(path).resolve()),
            stat.st_mtime_ns,
            stat.st_size,
            hash(tokenizer.src_model),
            hash(tokenizer.tgt_model),
        )
    except OSError:
        return Shortlist.read(path, tokenizer)  # names the missing file
    if key not in _READ:
        if len(_READ) >= 8:
            _READ.pop(next(iter(_READ)))
        _READ[key] = Shortlist.read(path, tokenizer)
    return _READ[key]
