"""SentencePiece subword tokenizers (unigram or BPE; joint or separate vocabularies).

Special ids are fixed for every model: PAD=0, UNK=1, BOS=2, EOS=3. A tokenizer is stored as the
serialized SentencePiece model bytes, so a checkpoint carries it without any extra file.
"""

from __future__ import annotations

import io
import re

import sentencepiece as spm

from nmt.errors import NmtError

PAD, UNK, BOS, EOS = 0, 1, 2, 3
MODEL_TYPES = ("unigram", "bpe")


def train_sentencepiece(lines: list[str], vocab_size: int, model_type: str) -> bytes:
    """Train a SentencePiece model in memory; on a tiny corpus the vocabulary shrinks to what fits."""
    if model_type not in MODEL_TYPES:
        raise NmtError(f"data.spm_model={model_type}: unknown; expected one of {', '.join(MODEL_TYPES)}")
    lines = [line for line in lines if line.strip()]
    if not lines:
        raise NmtError("cannot train a tokenizer on an empty corpus")
    while True:
        model = io.BytesIO()
        try:
            spm.SentencePieceTrainer.train(
                sentence_iterator=iter(lines),
                model_writer=model,
                vocab_size=vocab_size,
                model_type=model_type,
                pad_id=PAD,
                unk_id=UNK,
                bos_id=BOS,
                eos_id=EOS,
                character_coverage=1.0,
                input_sentence_size=2_000_000,
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
    def train(cls, src: list[str], tgt: list[str], vocab_size: int, model_type: str, joint: bool) -> "Tokenizer":
        """One joint model over both sides, or one model per side."""
        if joint:
            return cls(train_sentencepiece(src + tgt, vocab_size, model_type))
        return cls(train_sentencepiece(src, vocab_size, model_type), train_sentencepiece(tgt, vocab_size, model_type))
