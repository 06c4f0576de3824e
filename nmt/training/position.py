"""The data position of the Trainer: which batches an epoch holds, and which of them the next update reads.

An epoch's batches depend only on its batching settings (train.batch_tokens, train.seed, the subword alphas)
and its number, so a resumed run rebuilds them; with subword sampling on, the epoch's pairs are tokenized
afresh first. Shapes: B batch, T target length.
"""

from __future__ import annotations

import torch

from nmt.data.batching import Batch, token_batches
from nmt.data.sampling import sampled_pairs
from nmt.data.tokenizer import PAD


class DataPosition:
    """epoch_batches, next_group and my_batches of the Trainer (which holds cfg, data, dist and the counters)."""

    def epoch_batches(self) -> list[list[int]]:
        """The current epoch's batches (example indices); they depend only on the batching settings and the epoch.

        With subword sampling on, the epoch's pairs are first tokenized afresh (seeded by train.seed and the epoch).
        """
        batch_tokens, seed, alphas = self.batching
        if any(alphas):
            self.train_pairs = sampled_pairs(self.data.splits["train"], self.data.tokenizer, alphas, seed, self.epoch)
            self.epoch_lens = self.train_pairs.lengths()
        return token_batches(*self.epoch_lens, batch_tokens, seed, self.epoch)

    def batching_now(self) -> tuple[int, int, tuple[float, float]]:
        """The settings an epoch's batches are made with: train.batch_tokens, train.seed, the subword alphas."""
        return (
            self.cfg.train.batch_tokens,
            self.cfg.train.seed,
            (self.cfg.data.src_subword_alpha, self.cfg.data.tgt_subword_alpha),
        )

    def next_group(self) -> list[list[int]] | None:
        """The batches of the next update (accumulate x processes, fewer at an epoch's end); None at an epoch's end."""
        if self.batch_in_epoch >= len(self._batches):
            self.epoch, self.batch_in_epoch = self.epoch + 1, 0
            self.batching = self.batching_now()  # a change on resume starts here
            self._batches = self.epoch_batches()
            return None
        n = self.cfg.train.accumulate * self.dist.world
        group = self._batches[self.batch_in_epoch : self.batch_in_epoch + n]
        self.batch_in_epoch += len(group)
        return group

    def my_batches(self, group: list[list[int]]) -> list[Batch]:
        """This process's share of an update's batches; a process left without one gets a batch that counts for
        nothing."""
        split = self.train_pairs
        mine = group[self.dist.rank :: self.dist.world]
        if mine:
            return [split.batch(indices) for indices in mine]
        batch = split.batch(group[0])
        return [
            Batch(batch.src, batch.src_mask, batch.tgt_in, torch.full_like(batch.tgt_out, PAD))
        ]  # zero loss, zero gradient
