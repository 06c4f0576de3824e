"""The model zoo's builders: `BUILDERS`, one table from model.arch to the function that builds that model from
its config, and `build_model`. This module imports the model files; they never import it (nor each other's
builders), so the zoo has no import circle.

Shape legend: V vocabulary sizes (source, target).
"""

from __future__ import annotations

from collections.abc import Callable

from nmt.config import ModelConfig
from nmt.models.attention import make_attention
from nmt.models.bahdanau import BahdanauDecoder
from nmt.models.checks import check_model_config, check_rnn
from nmt.models.luong import LuongDecoder
from nmt.models.rnn import RNNDecoder, RNNEncoder, embedding
from nmt.models.seq2seq import Seq2Seq
from nmt.models.transformer import build_transformer


def transformer(cfg: ModelConfig, src_vocab: int, tgt_vocab: int, joint: bool) -> Seq2Seq:
    """Vaswani et al. 2017 (nmt/models/transformer.py)."""
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


def recurrent(cfg: ModelConfig, src_vocab: int, tgt_vocab: int, joint: bool) -> Seq2Seq:
    """Bahdanau et al. 2014 (nmt/models/bahdanau.py) or Luong et al. 2015 (nmt/models/luong.py), by cfg.arch."""
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


def build_rnn(
    decoder: str,
    src_vocab: int,
    tgt_vocab: int,
    share_src_embeddings: bool,
    cell: str,
    embed_dim: int,
    dim: int,
    layers: int,
    dropout: float,
    bidirectional: bool,
    bridge: str,
    score: str,
    window: str,
    window_size: int,
    input_feeding: bool,
    attention: str,
    gumbel_tau: float,
    max_src_len: int,
    tie_output: bool,
    embed_scale: bool = True,
) -> Seq2Seq:
    """A recurrent encoder and a Bahdanau or Luong decoder; with a joint vocabulary the embeddings are shared."""
    check_rnn(decoder, cell, bridge, score, window, attention, dim, embed_dim, bidirectional, tie_output)
    attn = make_attention(score, dim, dim, dim, window, window_size, attention, max_src_len, gumbel_tau)
    tgt_embed = embedding(tgt_vocab, embed_dim, embed_scale)
    src_embed = (
        tgt_embed if share_src_embeddings and src_vocab == tgt_vocab else embedding(src_vocab, embed_dim, embed_scale)
    )
    encoder = RNNEncoder(src_embed, cell, dim, layers, dropout, bidirectional, bridge)
    if decoder == "bahdanau":
        dec: RNNDecoder = BahdanauDecoder(tgt_embed, tgt_vocab, cell, dim, layers, dropout, attn, tie_output)
    else:
        dec = LuongDecoder(tgt_embed, tgt_vocab, cell, dim, layers, dropout, attn, input_feeding, tie_output)
    return Seq2Seq(encoder, dec)


BUILDERS: dict[str, Callable[[ModelConfig, int, int, bool], Seq2Seq]] = {
    "transformer": transformer,
    "bahdanau": recurrent,
    "luong": recurrent,
}


def build_model(cfg: ModelConfig, src_vocab: int, tgt_vocab: int, joint: bool) -> Seq2Seq:
    """Look the architecture up in BUILDERS."""
    check_model_config(cfg)
    return BUILDERS[cfg.arch](cfg, src_vocab, tgt_vocab, joint)
