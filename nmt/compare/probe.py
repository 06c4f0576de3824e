"""Attention on the references: each test pair forced through a trained model (teacher forcing).

Forcing the reference gives every variant the same output words, so their attention can be compared
with each other and with gold word alignments of the reference (as Luong et al. 2015, sec. 5.4, score
their attention by AER). For local-p models the predicted positions p_t (eq. 9) are recorded too.

Shape legend: B batch, S source length (+ </s>), T target length (+ EOS step), H hidden.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch

from nmt.data.batching import make_batch
from nmt.models.attention import LocalWindow
from nmt.models.seq2seq import Seq2Seq
from nmt.translation import eval_mode


@dataclass
class ForcedAttention:
    """One pair: attention (T + 1 steps, S + 1 source tokens), and p_t (T + 1,) for local-p models."""

    attention: np.ndarray
    positions: np.ndarray | None


def predictive_windows(model: torch.nn.Module) -> list[LocalWindow]:
    return [m for m in model.modules() if isinstance(m, LocalWindow) and m.predictive]


@contextmanager
def recorded_positions(model: torch.nn.Module) -> Iterator[list[torch.Tensor]]:
    """Collect every p_t (B, T) local-p computes inside the block (in call order); the model is left as it was.

    The position method is wrapped on the instance for the duration only: the model keeps no state.
    """
    found: list[torch.Tensor] = []
    windows = predictive_windows(model)
    for window in windows:
        original = window.positions

        def record(query, mask, steps, original=original):
            p = original(query, mask, steps)  # (B, T)
            found.append(p.detach())
            return p

        window.positions = record
    try:
        yield found
    finally:
        for window in windows:
            del window.positions


@torch.no_grad()
def forced_attention(
    model: Seq2Seq, src_ids: list[list[int]], tgt_ids: list[list[int]], device: torch.device, batch_size: int = 64
) -> list[ForcedAttention]:
    """Teacher-forced attention of each (source, reference) pair, in input order."""
    out: list[ForcedAttention | None] = [None] * len(src_ids)
    order = sorted(range(len(src_ids)), key=lambda i: (len(src_ids[i]), len(tgt_ids[i])))
    local_p = bool(predictive_windows(model))
    with eval_mode(model):
        for start in range(0, len(order), batch_size):
            rows = order[start : start + batch_size]
            batch = make_batch([src_ids[i] for i in rows], [tgt_ids[i] for i in rows]).to(device)
            with recorded_positions(model) as found:
                _, attn = model.decoder(
                    batch.tgt_in, model.encode(batch.src, batch.src_mask), need_attn=True
                )  # (B, T, S)
            positions = torch.cat(found, 1).float().cpu().numpy() if local_p else None  # (B, T)
            attn = attn.float().cpu().numpy()
            for b, i in enumerate(rows):
                steps, tokens = len(tgt_ids[i]) + 1, len(src_ids[i]) + 1
                out[i] = ForcedAttention(
                    attn[b, :steps, :tokens], positions[b, :steps] if positions is not None else None
                )
    return out  # type: ignore[return-value]


@torch.no_grad()
def forced_layer_attention(
    model: Seq2Seq, src_ids: list[list[int]], tgt_ids: list[list[int]], device: torch.device, batch_size: int = 64
) -> list[np.ndarray] | None:
    """Teacher-forced cross-attention of every decoder layer, mean over heads: (L, T + 1, S + 1) per pair, in input
    order; None for a model without layers of cross-attention (the RNNs)."""
    maps = getattr(model.decoder, "attention_maps", None)
    if maps is None:
        return None
    out: list[np.ndarray | None] = [None] * len(src_ids)
    order = sorted(range(len(src_ids)), key=lambda i: (len(src_ids[i]), len(tgt_ids[i])))
    with eval_mode(model):
        for start in range(0, len(order), batch_size):
            rows = order[start : start + batch_size]
            batch = make_batch([src_ids[i] for i in rows], [tgt_ids[i] for i in rows]).to(device)
            layers = (
                maps(batch.tgt_in, model.encode(batch.src, batch.src_mask)).mean(2).float().cpu().numpy()
            )  # (B, L, T, S)
            for b, i in enumerate(rows):
                out[i] = layers[b, :, : len(tgt_ids[i]) + 1, : len(src_ids[i]) + 1]
    return out  # type: ignore[return-value]
