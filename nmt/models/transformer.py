"""Transformer encoder-decoder (Vaswani et al. 2017, "Attention Is All You Need").

    Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V                      (eq. 1)
    MultiHead(Q, K, V) = Concat(head_1..head_N) W^O, head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)
    FFN(x) = max(0, x W_1 + b_1) W_2 + b_2                                  (eq. 2)
    PE(pos, 2i) = sin(pos / 10000^(2i/H)), PE(pos, 2i+1) = cos(pos / 10000^(2i/H))
Sub-layers are wrapped pre-norm, x + Drop(F(LN(x))) (Wang et al. 2019), or post-norm, LN(x + Drop(F(x))).

Shape legend: B batch, S source length, T target length, H model dim, V vocab, N heads, D head dim (H / N).
`step` keeps a key/value cache per decoder layer in the state (batch on dim 0); cross-attention keys and
values are computed once in `init_state`. `step` and `forward` return cross-attention reduced for plotting
(`reduce_attention`: last layer, mean over heads); `attention_maps` gives every layer and head (B, L, N, T, S).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from nmt.models.seq2seq import Enc, Seq2Seq, State

def sinusoidal_positions(length: int, dim: int, offset: int = 0) -> torch.Tensor:
    """(length, H) sinusoidal position encodings for positions offset..offset+length-1."""
    pos = torch.arange(offset, offset + length, dtype=torch.float32).unsqueeze(1)
    freq = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(10000.0) / dim))
    pe = torch.zeros(length, dim)
    pe[:, 0::2] = torch.sin(pos * freq)
    pe[:, 1::2] = torch.cos(pos * freq[: dim // 2])
    return pe


class Embedding(nn.Module):
    """Token embedding scaled by sqrt(H), plus sinusoidal positions, then dropout."""

    def __init__(self, vocab: int, dim: int, dropout: float):
        super().__init__()
        self.tokens = nn.Embedding(vocab, dim)
        nn.init.normal_(self.tokens.weight, std=dim**-0.5)
        self.dim = dim
        self.dropout = nn.Dropout(dropout)

    def forward(self, tokens: torch.Tensor, offset: int = 0) -> torch.Tensor:
        x = self.tokens(tokens) * math.sqrt(self.dim)  # (B, T, H)
        return self.dropout(x + sinusoidal_positions(tokens.size(1), self.dim, offset).to(x))


class MultiHeadAttention(nn.Module):
    """Multi-head scaled dot-product attention; `scale=False` drops the 1/sqrt(D) factor."""

    def __init__(self, dim: int, heads: int, dropout: float, scale: bool = True):
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.scale = 1 / math.sqrt(self.head_dim) if scale else 1.0
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (nn.Linear(dim, dim) for _ in range(4))
        self.dropout = dropout

    def split(self, x: torch.Tensor) -> torch.Tensor:
        """(B, L, H) -> (B, N, L, D)."""
        return x.view(x.size(0), x.size(1), self.heads, self.head_dim).transpose(1, 2)

    def keys_values(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Projected keys and values, each (B, N, L, D)."""
        return self.split(self.k_proj(x)), self.split(self.v_proj(x))

    def attend(
        self,
        query: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor | None = None,
        causal: bool = False,
        need_weights: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """query (B, T, H), k/v (B, N, L, D), mask broadcastable to (B, N, T, L) -> (B, T, H), weights (B, N, T, L)."""
        q = self.split(self.q_proj(query))  # (B, N, T, D)
        dropout = self.dropout if self.training else 0.0
        if need_weights:
            scores = (q @ k.transpose(-2, -1)) * self.scale  # (B, N, T, L)
            if causal:
                mask = torch.ones(q.size(2), k.size(2), dtype=torch.bool, device=q.device).tril()
            if mask is not None:
                scores = scores.masked_fill(~mask, float("-inf"))
            weights = scores.softmax(-1)
            out = F.dropout(weights, dropout, self.training) @ v
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout, is_causal=causal, scale=self.scale)
            weights = None
        out = out.transpose(1, 2).reshape(query.size(0), query.size(1), -1)  # (B, T, H)
        return self.out_proj(out), weights


class FeedForward(nn.Sequential):
    def __init__(self, dim: int, ffn_dim: int, dropout: float):
        super().__init__(nn.Linear(dim, ffn_dim), nn.ReLU(), nn.Dropout(dropout), nn.Linear(ffn_dim, dim))


class Residual(nn.Module):
    """Pre-norm x + Drop(F(LN(x))) or post-norm LN(x + Drop(F(x))) around a sub-layer."""

    def __init__(self, dim: int, dropout: float, norm: str):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.pre = norm == "pre"
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, sublayer) -> torch.Tensor:
        if self.pre:
            return x + self.dropout(sublayer(self.norm(x)))
        return self.norm(x + self.dropout(sublayer(x)))


class EncoderLayer(nn.Module):
    def __init__(self, dim: int, heads: int, ffn_dim: int, dropout: float, norm: str, scale: bool):
        super().__init__()
        self.attn = MultiHeadAttention(dim, heads, dropout, scale)
        self.ffn = FeedForward(dim, ffn_dim, dropout)
        self.res_attn, self.res_ffn = Residual(dim, dropout, norm), Residual(dim, dropout, norm)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = self.res_attn(x, lambda h: self.attn.attend(h, *self.attn.keys_values(h), mask=mask)[0])
        return self.res_ffn(x, self.ffn)


class TransformerEncoder(nn.Module):
    def __init__(self, embed: Embedding, layers: int, dim: int, heads: int, ffn_dim: int, dropout: float, norm: str, scale: bool):
        super().__init__()
        self.embed = embed
        self.layers = nn.ModuleList(EncoderLayer(dim, heads, ffn_dim, dropout, norm, scale) for _ in range(layers))
        self.final_norm = nn.LayerNorm(dim) if norm == "pre" else nn.Identity()

    def forward(self, src: torch.Tensor, src_mask: torch.Tensor) -> Enc:
        x = self.embed(src)  # (B, S, H)
        mask = src_mask[:, None, None, :]  # (B, 1, 1, S)
        for layer in self.layers:
            x = layer(x, mask)
        return {"memory": self.final_norm(x), "src_mask": src_mask}


class DecoderLayer(nn.Module):
    def __init__(self, dim: int, heads: int, ffn_dim: int, dropout: float, norm: str, scale: bool):
        super().__init__()
        self.self_attn = MultiHeadAttention(dim, heads, dropout, scale)
        self.cross_attn = MultiHeadAttention(dim, heads, dropout, scale)
        self.ffn = FeedForward(dim, ffn_dim, dropout)
        self.res_self, self.res_cross, self.res_ffn = (Residual(dim, dropout, norm) for _ in range(3))

    def forward(
        self,
        x: torch.Tensor,
        self_kv: tuple[torch.Tensor, torch.Tensor] | None,
        cross_kv: tuple[torch.Tensor, torch.Tensor],
        src_mask: torch.Tensor,
        need_weights: bool,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor], torch.Tensor | None]:
        """x (B, T, H). self_kv: the cache of earlier steps (step mode) or None (teacher forcing, causal).

        Returns the output (B, T, H), the self-attention keys/values including x's, and cross weights.
        """
        new_kv: list[tuple[torch.Tensor, torch.Tensor]] = []

        def self_block(h: torch.Tensor) -> torch.Tensor:
            k, v = self.self_attn.keys_values(h)  # (B, N, T, D)
            if self_kv is not None:
                k, v = torch.cat([self_kv[0], k], 2), torch.cat([self_kv[1], v], 2)
            new_kv.append((k, v))
            return self.self_attn.attend(h, k, v, causal=self_kv is None)[0]

        weights: list[torch.Tensor | None] = []

        def cross_block(h: torch.Tensor) -> torch.Tensor:
            out, w = self.cross_attn.attend(h, *cross_kv, mask=src_mask, need_weights=need_weights)
            weights.append(w)
            return out

        x = self.res_self(x, self_block)
        x = self.res_cross(x, cross_block)
        return self.res_ffn(x, self.ffn), new_kv[0], weights[0]


def reduce_attention(maps: torch.Tensor) -> torch.Tensor:
    """The reduction for plotting: (B, L, N, T, S) per layer and head -> the last layer's mean over heads (B, T, S)."""
    return maps[:, -1].mean(1)


class TransformerDecoder(nn.Module):
    def __init__(self, embed: Embedding, vocab: int, layers: int, dim: int, heads: int, ffn_dim: int, dropout: float, norm: str, scale: bool, tie_output: bool):
        super().__init__()
        self.embed = embed
        self.layers = nn.ModuleList(DecoderLayer(dim, heads, ffn_dim, dropout, norm, scale) for _ in range(layers))
        self.final_norm = nn.LayerNorm(dim) if norm == "pre" else nn.Identity()
        self.output = nn.Linear(dim, vocab, bias=False)
        if tie_output:
            self.output.weight = embed.tokens.weight

    def _cross_kv(self, enc: Enc) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [layer.cross_attn.keys_values(enc["memory"]) for layer in self.layers]

    def teacher_forced(self, tgt_in: torch.Tensor, enc: Enc, attn_layers: range) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits (B, T, V) and the cross-attention of the layers asked for (B, len(attn_layers), N, T, S), or None."""
        x = self.embed(tgt_in)  # (B, T, H)
        src_mask = enc["src_mask"][:, None, None, :]  # (B, 1, 1, S)
        maps = []
        for i, (layer, cross_kv) in enumerate(zip(self.layers, self._cross_kv(enc))):
            x, _, weights = layer(x, None, cross_kv, src_mask, i in attn_layers)
            if weights is not None:
                maps.append(weights)  # (B, N, T, S)
        return self.output(self.final_norm(x)), torch.stack(maps, 1) if maps else None

    def forward(self, tgt_in: torch.Tensor, enc: Enc, need_attn: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Teacher forcing: logits (B, T, V) and, if asked, cross-attention reduced for plotting (B, T, S)."""
        last = len(self.layers) - 1
        logits, maps = self.teacher_forced(tgt_in, enc, range(last, last + 1) if need_attn else range(0))
        return logits, reduce_attention(maps) if need_attn else None

    def attention_maps(self, tgt_in: torch.Tensor, enc: Enc) -> torch.Tensor:
        """Teacher-forced cross-attention of every layer and head (B, L, N, T, S)."""
        return self.teacher_forced(tgt_in, enc, range(len(self.layers)))[1]

    def init_state(self, enc: Enc) -> State:
        """Cross-attention keys/values (B, N, S, D) computed once; empty self-attention caches (B, N, 0, D)."""
        state: State = {}
        for i, (k, v) in enumerate(self._cross_kv(enc)):
            state[f"cross_k{i}"], state[f"cross_v{i}"] = k, v
            state[f"self_k{i}"], state[f"self_v{i}"] = k[:, :, :0], v[:, :, :0]
        return state

    def step(self, prev: torch.Tensor, enc: Enc, state: State) -> tuple[torch.Tensor, State, torch.Tensor]:
        """One token per sentence: prev (B,) -> logits (B, V), new state, attention (B, S)."""
        t = state["self_k0"].size(2)
        x = self.embed(prev[:, None], offset=t)  # (B, 1, H)
        src_mask = enc["src_mask"][:, None, None, :]
        new_state: State = {}
        weights = None
        for i, layer in enumerate(self.layers):
            cache = (state[f"self_k{i}"], state[f"self_v{i}"])
            cross = (state[f"cross_k{i}"], state[f"cross_v{i}"])
            x, (k, v), weights = layer(x, cache, cross, src_mask, i == len(self.layers) - 1)
            new_state.update({f"self_k{i}": k, f"self_v{i}": v, f"cross_k{i}": cross[0], f"cross_v{i}": cross[1]})
        logits = self.output(self.final_norm(x))[:, 0]  # (B, V)
        return logits, new_state, reduce_attention(weights[:, None])[:, 0]  # (B, S)


def build_transformer(
    src_vocab: int,
    tgt_vocab: int,
    share_src_embeddings: bool,
    dim: int,
    layers: int,
    heads: int,
    ffn_dim: int,
    dropout: float,
    norm: str,
    scale: bool,
    tie_output: bool,
) -> Seq2Seq:
    """A Transformer; with a joint vocabulary the source embedding is the target's too."""
    tgt_embed = Embedding(tgt_vocab, dim, dropout)
    src_embed = tgt_embed if share_src_embeddings and src_vocab == tgt_vocab else Embedding(src_vocab, dim, dropout)
    encoder = TransformerEncoder(src_embed, layers, dim, heads, ffn_dim, dropout, norm, scale)
    decoder = TransformerDecoder(tgt_embed, tgt_vocab, layers, dim, heads, ffn_dim, dropout, norm, scale, tie_output)
    return Seq2Seq(encoder, decoder)
