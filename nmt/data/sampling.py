"""Subword sampling: the training pairs tokenized afresh each epoch (BPE-dropout, or unigram subword regularization).

SentencePiece samples a segmentation per sentence: for a BPE model, `alpha` is the probability of dropping
each merge (BPE-dropout; 0.1 is the usual value); for a unigram model, the smoothing exponent over all
segmentations (smaller is flatter: 0.1 samples heavily, 0.5 less). Validation, test and translation keep the
one deterministic segmentation. A sample depends only on (seed, epoch, side), so a resumed run sees the same.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import sentencepiece as spm

from nmt.data.split import EncodedPairs, Rows, Split
from nmt.data.tokenizer import Tokenizer

CHUNK = 10_000  # sentences encoded (and held as Python lists) at a time


def sampled_rows(processor: spm.SentencePieceProcessor, lines, alpha: float, seed: list[int]) -> Rows:
    """Every line of `lines` (a sized, sliceable column) encoded with sampling; the same lines and seed give the same ids."""
    spm.set_random_generator_seed(int(np.random.default_rng(seed).integers(1 << 31)))  # SentencePiece's one global generator
    chunks = []
    for start in range(0, len(lines), CHUNK):
        ids = processor.encode(lines[start : start + CHUNK], enable_sampling=True, alpha=alpha, nbest_size=-1, num_threads=1)  # 1: deterministic
        chunks.append(pa.array(ids, type=pa.list_(pa.int32())))
    return Rows(pa.chunked_array(chunks, type=pa.list_(pa.int32())))


def sampled_pairs(split: Split, tokenizer: Tokenizer, alphas: tuple[float, float], seed: int, epoch: int) -> EncodedPairs:
    """This epoch's tokenization of `split`: each side sampled with its alpha (source, target), or its cached ids at 0."""
    src = sampled_rows(tokenizer.src, split.src_text, alphas[0], [seed, epoch, 0]) if alphas[0] else split.src_rows
    tgt = sampled_rows(tokenizer.tgt, split.tgt_text, alphas[1], [seed, epoch, 1]) if alphas[1] else split.tgt_rows
    return EncodedPairs(src, tgt)
