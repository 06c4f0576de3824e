"""Translate lists of sentences with a trained model: batching by length, restoring input order.

Every input line gets exactly one output line; blank lines give empty outputs without reaching the model.
"""

from __future__ import annotations

from typing import Callable, Iterator

import torch

from nmt.config import DecodeConfig
from nmt.data.batching import make_batch
from nmt.data.tokenizer import Tokenizer
from nmt.errors import NmtError
from nmt.models.seq2seq import Seq2Seq
from nmt.search import Hypothesis, greedy_search, max_lengths


def decode_settings(decode: DecodeConfig) -> str:
    """The search settings printed beside every score."""
    return f"beam={decode.beam} alpha={decode.alpha} max_len={decode.max_len_a}*src+{decode.max_len_b}"


class Translator:
    """A model, its tokenizer and search settings."""

    def __init__(self, model: Seq2Seq, tokenizer: Tokenizer, decode: DecodeConfig, device: torch.device):
        if decode.beam < 1:
            raise NmtError(f"decode.beam={decode.beam}: expected a positive beam size")
        if decode.beam > 1:
            raise NmtError(f"decode.beam={decode.beam}: beam search is not available yet; use decode.beam=1")
        self.model, self.tokenizer, self.decode, self.device = model, tokenizer, decode, device

    def search(self, src_ids: list[list[int]]) -> list[Hypothesis]:
        """Decode one batch of encoded sentences (in the given order)."""
        batch = make_batch(src_ids).to(self.device)
        max_len = max_lengths(batch.src_mask, self.decode.max_len_a, self.decode.max_len_b)
        return greedy_search(self.model, batch.src, batch.src_mask, max_len)

    def batches(self, lines: list[str]) -> Iterator[tuple[list[int], list[Hypothesis]]]:
        """(line indices, hypotheses) per batch; non-blank lines only, shortest first."""
        ids = self.tokenizer.encode_src(lines)
        order = sorted((i for i, line in enumerate(lines) if line.strip()), key=lambda i: len(ids[i]))
        size = self.decode.batch_size
        was_training = self.model.training
        self.model.eval()
        try:
            for start in range(0, len(order), size):
                chunk = order[start : start + size]
                yield chunk, self.search([ids[i] for i in chunk])
        finally:
            self.model.train(was_training)

    def translate(self, lines: list[str], progress: Callable[[int], None] | None = None) -> list[str]:
        """One detokenized output per input line, in input order."""
        out = [""] * len(lines)
        for chunk, hyps in self.batches(lines):
            for i, text in zip(chunk, self.tokenizer.decode_tgt([h.tokens for h in hyps])):
                out[i] = text
            if progress is not None:
                progress(len(chunk))
        return out
