"""Token-budget batches with length bucketing, and padding into tensors.

Shapes: B batch, S source length, T target length.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from nmt.data.tokenizer import BOS, EOS, PAD


def token_batches(
    src_lens: Sequence[int], tgt_lens: Sequence[int], batch_tokens: int, seed: int, epoch: int, shuffle: bool = True
) -> list[list[int]]:
    """Split example indices into batches of at most `batch_tokens` padded tokens.

    Examples are sorted by length (ties broken by a seeded draw) so a batch holds similar lengths;
    the batch order is then shuffled. Each index appears in exactly one batch; an example longer than
    the budget gets a batch of its own. The result depends only on (seed, epoch).
    """
    rng = np.random.default_rng([seed, epoch])
    src_a, tgt_a = np.asarray(src_lens, dtype=np.int64) + 1, np.asarray(tgt_lens, dtype=np.int64) + 1  # + EOS / BOS
    ties = rng.random(len(src_a)) if shuffle else np.arange(len(src_a))
    order = np.lexsort((ties, src_a, tgt_a))
    starts, count, longest = [], 0, 0  # where each batch starts in `order`
    for position, length in enumerate(np.maximum(src_a, tgt_a)[order].tolist()):  # plain (mostly cached small) ints: a fast loop
        if count and max(longest, length) * (count + 1) > batch_tokens:
            starts.append(position)
            count, longest = 0, 0
        count += 1
        longest = max(longest, length)
    batches = [chunk.tolist() for chunk in np.split(order, starts)] if len(order) else []
    if shuffle:
        rng.shuffle(batches)
    return batches


def pad(sequences: list[list[int]], value: int = PAD) -> torch.Tensor:
    """(B, max len) long tensor, right-padded."""
    out = torch.full((len(sequences), max((len(s) for s in sequences), default=0)), value, dtype=torch.long)
    for row, seq in enumerate(sequences):
        out[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
    return out


@dataclass
class Batch:
    """A padded batch; masks are bool with True = real token."""

    src: torch.Tensor  # (B, S) tokens + EOS
    src_mask: torch.Tensor  # (B, S)
    tgt_in: torch.Tensor | None = None  # (B, T) BOS + tokens
    tgt_out: torch.Tensor | None = None  # (B, T) tokens + EOS

    @property
    def target_tokens(self) -> int:
        return int((self.tgt_out != PAD).sum()) if self.tgt_out is not None else 0

    def to(self, device: torch.device) -> "Batch":
        move = lambda t: None if t is None else t.to(device)  # noqa: E731
        return Batch(move(self.src), move(self.src_mask), move(self.tgt_in), move(self.tgt_out))


def make_batch(src: list[list[int]], tgt: list[list[int]] | None = None) -> Batch:
    """Append EOS to sources, build teacher-forcing inputs/outputs for targets, and pad."""
    src_t = pad([s + [EOS] for s in src])
    if tgt is None:
        return Batch(src_t, src_t != PAD)
    return Batch(src_t, src_t != PAD, pad([[BOS] + t for t in tgt]), pad([t + [EOS] for t in tgt]))


def pad_rows(values: np.ndarray, lengths: np.ndarray, bos: bool) -> torch.Tensor:
    """(B, max len + 1) long tensor of rows laid end to end in `values`: BOS + row, or row + EOS; right-padded."""
    width = int(lengths.max(initial=0)) + 1
    out = np.full((len(lengths), width), PAD, dtype=np.int64)
    columns = np.arange(width)
    start = int(bos)
    out[(columns >= start) & (columns < lengths[:, None] + start)] = values  # row-major: row by row, in order
    if bos:
        out[:, 0] = BOS
    else:
        out[np.arange(len(lengths)), lengths] = EOS
    return torch.from_numpy(out)


def rows_batch(src: tuple[np.ndarray, np.ndarray], tgt: tuple[np.ndarray, np.ndarray]) -> Batch:
    """`make_batch` of rows given as (values end to end, lengths), without a Python list per row."""
    src_t = pad_rows(*src, bos=False)
    return Batch(src_t, src_t != PAD, pad_rows(*tgt, bos=True), pad_rows(*tgt, bos=False))
