"""SentencePiece subword tokenizers (unigram or BPE; joint or separate vocabularies).

Special ids are fixed for every model: PAD=0, UNK=1, BOS=2, EOS=3. A tokenizer is stored as the
serialized SentencePiece model bytes, so a checkpoint carries it without any extra file.
"""

from __future__ import annotations

import io
import re
from itertools import chain
from typing import Collection, Iterator

import numpy as np
import sentencepiece as spm

from nmt.errors import NmtError

PAD, UNK, BOS, EOS = 0, 1, 2, 3
MODEL_TYPES = ("unigram", "bpe")
SAMPLE_SEED = 1  # which sentences of a large corpus the tokenizer is trained on
MAX_SAMPLE = 2_000_000  # at most this many sentences: SentencePiece would sample more itself, differently in each process


class Sides:
    """Several columns of sentences read one after the other, as often as asked (a joint vocabulary's corpus)."""

    def __init__(self, *sides: Collection[str]):
        self.sides = sides

    def __len__(self) -> int:
        return sum(len(side) for side in self.sides)

    def __iter__(self) -> Iterator[str]:
        return chain.from_iterable(self.sides)


def sample_lines(lines: Collection[str], size: int | None) -> Collection[str]:
    """At most `size` (and MAX_SAMPLE) of the lines, drawn by a seeded generator, in corpus order; all when fewer.

    SentencePiece's own sampling (input_sentence_size) draws another sample in each process.
    """
    size = MAX_SAMPLE if size is None else min(size, MAX_SAMPLE)
    if len(lines) <= size:
        return lines
    chosen = np.zeros(len(lines), dtype=bool)
    chosen[np.random.default_rng(SAMPLE_SEED).choice(len(lines), size, replace=False)] = True
    return [line for line, keep in zip(lines, chosen.tolist()) if keep]


def train_sentencepiece(lines: Collection[str], vocab_size: int, model_type: str, sample: int | None = None) -> bytes:
    """Train a SentencePiece model in memory; on a tiny corpus the vocabulary shrinks to what fits.

    `lines` is streamed (a list, or a sized iterable that can be read more than once); the model is
    trained on a sample of at most `sample` (and MAX_SAMPLE) of them: its memory grows with the sample.
    """
    if model_type not in MODEL_TYPES:
        raise NmtError(f"data.spm_model={model_type}: unknown; expected one of {', '.join(MODEL_TYPES)}")
    lines = sample_lines(lines, sample)
    nonblank = lambda: (line for line in lines if line.strip())  # noqa: E731
    if next(nonblank(), None) is None:
        raise NmtError("cannot train a tokenizer on an empty corpus")
    while True:
        model = io.BytesIO()
        try:
            spm.SentencePieceTrainer.train(
                sentence_iterator=nonblank(),
                model_writer=model,
                vocab_size=vocab_size,
                model_type=model_type,
                pad_id=PAD,
                unk_id=UNK,
                bos_id=BOS,
                eos_id=EOS,
                character_coverage=1.0,
                input_sentence_size=MAX_SAMPLE,  # never reached (sample_lines samples first); the value shapes the model
                shuffle_input_sentence=True,
                num_threads=1,
                minloglevel=2,
            )
            return model.getvalue()
        except RuntimeError as err:
            # "Vocabulary size too high (800). Please set it to a value <= 512."
            match = re.search(r"value <= (\d+)", str(err))
            if not match or int(match.group(1)) >= vocab_size:
                raise NmtError(f"tokenizer training failed: {err}") from None
            vocab_size = int(match.group(1))


def _processor(model: bytes) -> spm.SentencePieceProcessor:
    return spm.SentencePieceProcessor(model_proto=model)


class Tokenizer:
    """Source and target SentencePiece models (the same model when the vocabulary is joint)."""

    def __init__(self, src_model: bytes, tgt_model: bytes | None = None):
        self.src_model = src_model
        self.tgt_model = tgt_model
        self.src = _processor(src_model)
        self.tgt = self.src if tgt_model is None else _processor(tgt_model)

    @property
    def joint(self) -> bool:
        return self.tgt_model is None

    @property
    def src_vocab_size(self) -> int:
        return self.src.get_piece_size()

    @property
    def tgt_vocab_size(self) -> int:
        return self.tgt.get_piece_size()

    def encode_src(self, lines: list[str]) -> list[list[int]]:
        return self.src.encode(lines)

    def encode_tgt(self, lines: list[str]) -> list[list[int]]:
        return self.tgt.encode(lines)

    def decode_tgt(self, ids: list[list[int]]) -> list[str]:
        return self.tgt.decode(ids)

    def state(self) -> dict[str, bytes]:
        """What a checkpoint stores: the serialized models."""
        return {"src": self.src_model} | ({} if self.joint else {"tgt": self.tgt_model})

    @classmethod
    def from_state(cls, state: dict[str, bytes]) -> "Tokenizer":
        return cls(state["src"], state.get("tgt"))

    @classmethod
    def train(
        cls, src: Collection[str], tgt: Collection[str], vocab_size: int, model_type: str, joint: bool, sample: int | None = None
    ) -> "Tokenizer":
        """One joint model over both sides, or one model per side (sides read more than once: lists or columns)."""
        if joint:
            return cls(train_sentencepiece(Sides(src, tgt), vocab_size, model_type, sample))
        return cls(train_sentencepiece(src, vocab_size, model_type, sample), train_sentencepiece(tgt, vocab_size, model_type, sample))
