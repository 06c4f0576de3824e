"""The encoder-decoder interface every model implements, and `build_model`.

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
so search reorders beams with one index_select and never asks which model it runs (`reorder`; a state tensor
that is the first positions of a larger buffer keeps that room, `select_rows`). A state may be stepped more than
once (each step returns a new state; a decoder that writes into buffers ahead copies them first when they are
not this state's alone). Masks are bool, True = real token.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from nmt.config import ModelConfig
from nmt.models.checks import check_model_config

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
    entries index into (a Transformer decoding copy's caches, `TransformerDecoder._shared`)."""
    return {key: value if shared(key) else select_rows(value, index) for key, value in tensors.items()}


def shared(key: str) -> bool:
    """Whether a state or encoder-output entry is shared by all rows rather than one row per dim-0 index."""
    return key.rpartition(".")[2].startswith("shared_")


def room(x: torch.Tensor) -> int:
    """Positions along dim 2 of the buffer behind x (R, N, T, D) when x is its first T positions (a Transformer
    decoding copy's self-attention cache, allocated ahead): each row's and head's positions contiguous, and the
    storage holding them all; x.size(2) for any other tensor."""
    if x.dim() != 4 or x.numel() == 0 or x.stride(3) != 1 or x.stride(2) != x.size(3):
        return x.size(2) if x.dim() == 4 else 0
    rows, heads, _, dim = x.shape
    positions = x.stride(1) // dim
    if x.stride(1) % dim or x.stride(0) != heads * x.stride(1) or positions < x.size(2):
        return x.size(2)
    end = x.storage_offset() + rows * x.stride(0)  # one past the last row's buffer
    return positions if x.untyped_storage().nbytes() >= end * x.element_size() else x.size(2)


def select_rows(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """x.index_select(0, index). A tensor with `room` past its positions keeps it: its rows are copied into a new
    buffer of the same room, so the next step can write there instead of copying the cache again."""
    positions = room(x)
    if x.dim() != 4 or positions <= x.size(2):
        return x.index_select(0, index)
    rows = x.new_empty(index.numel(), x.size(1), positions, x.size(3))[:, :, : x.size(2)]
    torch.index_select(x, 0, index, out=rows)
    return rows


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


def _build_transformer(cfg: ModelConfig, src_vocab: int, tgt_vocab: int, joint: bool) -> Seq2Seq:
    from nmt.models.transformer import build_transformer

    return build_transformer(
        src_vocab=src_vocab,
        tgt_vocab=tgt_vocab,
        share_src_embeddings=joint and cfg.tie_embeddings,
        dim=cfg.dim,
        layers=cfg.layers,
        heads=cfg.heads,
        ffn_dim=cfg.ffn_dim,
        dropout=cfg.dropout,
        norm=cfg.norm,
        scale=cfg.scale,
        tie_output=cfg.tie_embeddings,
    )


def _build_rnn(cfg: ModelConfig, src_vocab: int, tgt_vocab: int, joint: bool) -> Seq2Seq:
    from nmt.models.rnn import build_rnn

    return build_rnn(
        decoder=cfg.arch,
        src_vocab=src_vocab,
        tgt_vocab=tgt_vocab,
        share_src_embeddings=joint and cfg.tie_embeddings,
        cell=cfg.cell,
        embed_dim=cfg.dim if cfg.embed_dim is None else cfg.embed_dim,
        dim=cfg.dim,
        layers=cfg.layers,
        dropout=cfg.dropout,
        bidirectional=cfg.bidirectional,
        bridge=cfg.bridge,
        score=cfg.score,
        window=cfg.window,
        window_size=cfg.window_size,
        input_feeding=cfg.input_feeding,
        attention=cfg.attention,
        gumbel_tau=cfg.gumbel_tau,
        max_src_len=cfg.max_src_len,
        tie_output=cfg.tie_embeddings,
        embed_scale=cfg.embed_scale,
    )


BUILDERS: dict[str, Callable[[ModelConfig, int, int, bool], Seq2Seq]] = {
    "transformer": _build_transformer,
    "bahdanau": _build_rnn,  # Bahdanau et al. 2014 (nmt/models/bahdanau.py)
    "luong": _build_rnn,  # Luong et al. 2015 (nmt/models/luong.py)
}


def build_model(cfg: ModelConfig, src_vocab: int, tgt_vocab: int, joint: bool) -> Seq2Seq:
    """Look the architecture up in BUILDERS."""
    check_model_config(cfg)
    return BUILDERS[cfg.arch](cfg, src_vocab, tgt_vocab, joint)
