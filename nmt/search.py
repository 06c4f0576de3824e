"""Decoding through the decoder interface (`init_state` / `step`); no search asks which model it runs.

Shape legend: B batch, S source length, V vocab.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from nmt.data.tokenizer import BOS, EOS
from nmt.models.seq2seq import Seq2Seq, reorder


@dataclass
class Hypothesis:
    """One output: tokens without BOS/EOS, the sum of their log-probabilities, attention (len(tokens)+1, S)."""

    tokens: list[int]
    score: float
    attention: torch.Tensor


def max_lengths(src_mask: torch.Tensor, a: float, b: int) -> torch.Tensor:
    """(B,) output length limits a * source length + b (source length without EOS)."""
    return ((src_mask.sum(1) - 1).float() * a + b).long().clamp(min=1)


@torch.no_grad()
def greedy_search(model: Seq2Seq, src: torch.Tensor, src_mask: torch.Tensor, max_len: torch.Tensor) -> list[Hypothesis]:
    """Pick the most probable token at each step; a sentence leaves the batch when it emits EOS."""
    enc = model.encode(src, src_mask)
    state = model.init_state(enc)
    batch, steps = src.size(0), int(max_len.max())
    active = torch.arange(batch, device=src.device)  # original row of each live row
    prev = torch.full((batch,), BOS, dtype=torch.long, device=src.device)
    out = torch.full((batch, steps), EOS, dtype=torch.long, device=src.device)  # (B, T)
    scores = torch.zeros(batch, device=src.device)
    attn_out = torch.zeros(batch, steps, src.size(1), device=src.device)  # (B, T, S)
    for t in range(steps):
        logits, state, attn = model.step(prev, enc, state)  # (B, V), state, (B, S)
        best, prev = logits.log_softmax(-1).max(-1)
        out[active, t], attn_out[active, t] = prev, attn
        scores[active] += best
        live = (prev != EOS) & (max_len[active] > t + 1)
        if not bool(live.all()):
            keep = live.nonzero().squeeze(1)
            if keep.numel() == 0:
                break
            active, prev = active[keep], prev[keep]
            enc, state = reorder(enc, keep), reorder(state, keep)
    return _hypotheses(out.cpu(), scores.cpu(), attn_out.cpu(), src_mask.sum(1).cpu())


def _hypotheses(out: torch.Tensor, scores: torch.Tensor, attn: torch.Tensor, src_lens: torch.Tensor) -> list[Hypothesis]:
    """Cut each row at its first EOS (kept in the attention rows, not in the tokens)."""
    hyps = []
    for row, tokens in enumerate(out.tolist()):
        length = tokens.index(EOS) if EOS in tokens else len(tokens)
        steps = min(length + 1, len(tokens))
        hyps.append(Hypothesis(tokens[:length], float(scores[row]), attn[row, :steps, : int(src_lens[row])]))
    return hyps
