"""The encoder-decoder interface every model implements (nmt.models.builders builds them).

Shape legend: B batch, S source length, T target length, H hidden, V vocab.

An encoder maps (src (B, S), src_mask (B, S)) to `Enc`, a dict of tensors with the sentence on dim 0
(at least "memory" (B, S, H) and "src_mask" (B, S)). A decoder offers
    prepare(enc) -> Enc       adds what every step reads and that depends on the sentence only (cross-
                              attention keys and values, prepared attention keys), computed once
    init_state(enc) -> State
    step(prev (R,), enc, state, output=None) -> (logits (R, V), State, attn (R, S))
                              (output: a layer that replaces `output` for this step, e.g. a shortlist's rows)
    features(tgt_in (B, T), enc, need_attn) -> (the output layer's input (B, T, E), attn (B, T, S) or None)
    output                    the output layer, E -> V
    forward(tgt_in (B, T), enc, need_attn) -> (logits (B, T, V), attn (B, T, S) or None)
`step` runs R = B * G rows, G per sentence, sentence-major (rows b*G .. b*G+G-1 belong to sentence b of
`enc`): beam search keeps its K hypotheses of a sentence as K rows over one copy of the sentence's
encoding, so nothing per sentence is copied per beam. State is a dict of tensors with the row on dim 0,
so search reorders beams with one index_select and never asks which model it runs (`reorder`). A state may be
stepped more than once (each step returns a new state; a decoder that writes into buffers shared by several
states copies them first when they are not this state's alone). Masks are bool, True = real token.
"""

from __future__ import annotations

import torch
from torch import nn

State = dict[str, torch.Tensor]
Enc = dict[str, torch.Tensor]


def by_sentence(rows: torch.Tensor, sentences: int) -> torch.Tensor:
    """(R, T, *) step rows, R // sentences per sentence and sentence-major -> (B, R // B * T, *).

    A sentence's rows become queries side by side, so one attention call serves them all against
    the sentence's single copy of its keys. `rows.reshape(R, T, ...)` undoes it.
    """
    return rows.reshape(sentences, -1, *rows.shape[2:])


def reorder(tensors: dict[str, torch.Tensor], index: torch.Tensor) -> dict[str, torch.Tensor]:
    """Select rows (dim 0) of every tensor: beam reordering, tiling, or dropping finished sentences. Entries named
    "shared_*" (after any "m." prefix of an ensemble) are not per row, and pass through: buffers that per-row
    entries index into (a decoding copy's caches, nmt.engine.transformer)."""
    return {key: value if shared(key) else value.index_select(0, index) for key, value in tensors.items()}


def shared(key: str) -> bool:
    """Whether a state or encoder-output entry is shared by all rows rather than one row per dim-0 index."""
    return key.rpartition(".")[2].startswith("shared_")


def prefill(model: nn.Module, tokens: torch.Tensor, enc: Enc, state: State, **step_args):
    """Teacher-force `tokens` (B, P) through the decoder: logits (B, P, V), the state after them, attention (B, P, S).
    One pass where the model or its decoder has one (`prefill`: the Transformer's, a shortlist's), else a step per
    token (the RNNs and ensembles, whose steps are sequential by nature). `step_args` go to every step (output=)."""
    if hasattr(model, "prefill"):
        return model.prefill(tokens, enc, state, **step_args)
    decoder = getattr(model, "decoder", None)
    if decoder is not None and hasattr(decoder, "prefill"):
        return decoder.prefill(tokens, enc, state, **step_args)
    out, attn = [], []
    for i in range(tokens.size(1)):
        logits, state, weights = model.step(tokens[:, i], enc, state, **step_args)
        out.append(logits)
        attn.append(weights)
    return torch.stack(out, 1), state, torch.stack(attn, 1)


class Seq2Seq(nn.Module):
    """An encoder and a decoder behind one interface."""

    def __init__(self, encoder: nn.Module, decoder: nn.Module):
        super().__init__()
        self.encoder = encoder
        self.decoder = decoder

    def encode(self, src: torch.Tensor, src_mask: torch.Tensor) -> Enc:
        """The encoder's output and what the decoder's steps read from it, one row per sentence."""
        return self.decoder.prepare(self.encoder(src, src_mask))

    def init_state(self, enc: Enc) -> State:
        return self.decoder.init_state(enc)

    def step(
        self, prev: torch.Tensor, enc: Enc, state: State, output: nn.Module | None = None
    ) -> tuple[torch.Tensor, State, torch.Tensor]:
        return self.decoder.step(prev, enc, state, output=output)

    def forward(
        self, src: torch.Tensor, src_mask: torch.Tensor, tgt_in: torch.Tensor, live: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Teacher-forced logits (B, T, V); with live (B, T) bool, those of the live positions only (N, V), row-major.

        Training passes the real (non-padding) target positions as live: the output layer, the widest
        product of a step, then skips the padding.
        """
        features, _ = self.decoder.features(tgt_in, self.encoder(src, src_mask))  # (B, T, E)
        return self.decoder.output(features if live is None else features[live])
