"""Transformer encoder-decoder (Vaswani et al. 2017, "Attention Is All You Need").

    Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V                      (eq. 1)
    MultiHead(Q, K, V) = Concat(head_1..head_N) W^O, head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)
    FFN(x) = max(0, x W_1 + b_1) W_2 + b_2                                  (eq. 2)
    PE(pos, 2i) = sin(pos / 10000^(2i/H)), PE(pos, 2i+1) = cos(pos / 10000^(2i/H))
Sub-layers are wrapped pre-norm, x + Drop(F(LN(x))) (Wang et al. 2019), or post-norm, LN(x + Drop(F(x))).

Shape legend: B batch, S source length, T target length, H model dim, V vocab, N heads, D head dim (H / N),
R step rows (R // B per sentence), P positions per row in one pass.
`step` keeps a key/value cache per decoder layer in the state (one row per hypothesis); cross-attention
keys and values are computed once per sentence in `prepare`, and a sentence's rows (its beams) query
them together. `step` and `forward` return cross-attention reduced for plotting
(`reduce_attention`: last layer, mean over heads); `attention_maps` gives every layer and head (B, L, N, T, S).
This is the reference: the decoding engine (nmt.engine) makes faster copies of a trained model and is tested
against it.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from nmt.models.dropout import Dropout
from nmt.models.dropout import dropout as drop
from nmt.models.norm import InputNorm
from nmt.models.seq2seq import Enc, Seq2Seq, State, by_sentence


def sinusoidal_positions(length: int, dim: int, offset: int = 0) -> torch.Tensor:
    """(length, H) sinusoidal position encodings for positions offset..offset+length-1."""
    pos = torch.arange(offset, offset + length, dtype=torch.float32).unsqueeze(1)
    freq = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(10000.0) / dim))
    pe = torch.zeros(length, dim)
    pe[:, 0::2] = torch.sin(pos * freq)
    pe[:, 1::2] = torch.cos(pos * freq[: dim // 2])
    return pe


POSITIONS = 1024  # positions kept in a table; later ones are computed when asked (there is no length limit)


class Embedding(nn.Module):
    """Token embedding scaled by sqrt(H), plus sinusoidal positions, then dropout."""

    def __init__(self, vocab: int, dim: int, dropout: float):
        super().__init__()
        self.tokens = nn.Embedding(vocab, dim)
        nn.init.normal_(self.tokens.weight, std=dim**-0.5)
        self.dim = dim
        self.dropout = Dropout(dropout)
        # the same values sinusoidal_positions gives for any slice (not saved: checkpoints are unchanged);
        # a decoding step reads its row instead of computing it (a dozen small operations)
        self.register_buffer("positions", sinusoidal_positions(POSITIONS, dim), persistent=False)

    def forward(self, tokens: torch.Tensor, offset: int = 0) -> torch.Tensor:
        x = self.tokens(tokens) * math.sqrt(self.dim)  # (B, T, H)
        end = offset + tokens.size(1)
        pe = (
            self.positions[offset:end]
            if end <= self.positions.size(0)
            else sinusoidal_positions(tokens.size(1), self.dim, offset).to(x)
        )
        return self.dropout(x + pe)


def explicit_products(q: torch.Tensor, dropout: float) -> bool:
    """Whether attention on a CPU runs faster as explicit products than through F.scaled_dot_product_attention.

    Measured on this project's shapes (scripts/bench_train.py): on a CPU, SDPA's bf16 kernel takes 3-6x longer
    forward and backward than two bmm and a softmax, and with dropout SDPA falls back to a slower path with
    torch's own dropout; SDPA stays faster in float32 without dropout (evaluation), and on GPUs.
    """
    return q.device.type == "cpu" and (q.dtype != torch.float32 or dropout > 0)


def project(x: torch.Tensor, *linears: nn.Linear) -> tuple[torch.Tensor, ...]:
    """x (B, L, H) through each of `linears` (the W^Q, W^K, W^V of the same input). Under autocast they run as one
    product of their weights side by side: x is cast once and one product is made, forward and backward (separate
    layers cast the same input three times: 61 copies of each (B, L, H) shape per bf16 update, 30-36 with this);
    equal within rounding. Without autocast each is its own layer, as written."""
    if len(linears) == 1 or not torch.is_autocast_enabled(x.device.type):
        return tuple(linear(x) for linear in linears)
    weight = torch.cat([linear.weight for linear in linears])
    bias = torch.cat([linear.bias for linear in linears])
    return F.linear(x, weight, bias).split([linear.out_features for linear in linears], -1)


class MultiHeadAttention(nn.Module):
    """Multi-head scaled dot-product attention (eq. 1 and the MultiHead equation); `scale=False` drops the
    1/sqrt(D) factor."""

    def __init__(self, dim: int, heads: int, dropout: float, scale: bool = True):
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.scale = 1 / math.sqrt(self.head_dim) if scale else 1.0
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (nn.Linear(dim, dim) for _ in range(4))
        self.dropout = dropout

    def split(self, x: torch.Tensor) -> torch.Tensor:
        """(B, L, H) -> (B, N, L, D)."""
        return x.view(x.size(0), x.size(1), self.heads, self.head_dim).transpose(1, 2)

    def projections(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Self-attention's projected queries, keys and values of x (B, L, H), each (B, N, L, D)."""
        return tuple(self.split(p) for p in project(x, self.q_proj, self.k_proj, self.v_proj))

    def keys_values(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Projected keys and values, each (B, N, L, D)."""
        k, v = project(x, self.k_proj, self.v_proj)
        return self.split(k), self.split(v)

    def self_attend(
        self,
        x: torch.Tensor,
        cache: tuple[torch.Tensor, torch.Tensor] | None = None,
        mask: torch.Tensor | None = None,
        causal: bool = False,
        need_weights: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None, tuple[torch.Tensor, torch.Tensor]]:
        """Self-attention of x (B, L, H), after the cached keys/values (B, N, t, D) if given ->
        (B, L, H), weights (B, N, L, t + L) or None, and the keys/values (B, N, t + L, D)."""
        q, k, v = self.projections(x)
        if cache is not None:
            k, v = torch.cat([cache[0], k], 2), torch.cat([cache[1], v], 2)
        out, weights = self.attend_projected(q, k, v, mask, causal, need_weights)
        return out, weights, (k, v)

    def attend(
        self, query: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **options
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """query (B, T, H), k/v (B, N, L, D) -> (B, T, H), weights (B, N, T, L); options (mask broadcastable to
        (B, N, T, L), causal, need_weights) as in `attend_projected`."""
        return self.attend_projected(self.split(self.q_proj(query)), k, v, **options)

    def attend_projected(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor | None = None,
        causal: bool = False,
        need_weights: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`attend` for projected queries q (B, N, T, D): eq. 1 per head, then W^O over the heads side by side."""
        dropout = self.dropout if self.training else 0.0
        if need_weights or explicit_products(q, dropout):
            scores = q @ k.transpose(-2, -1)  # (B, N, T, L)
            if self.scale != 1.0:
                scores = scores * self.scale
            if causal:
                mask = torch.ones(q.size(2), k.size(2), dtype=torch.bool, device=q.device).tril()
            if mask is not None:
                scores = scores.masked_fill(~mask, float("-inf"))
            weights = self.softmax(scores)
            out = drop(weights, dropout, self.training) @ v
            weights = weights if need_weights else None
        else:
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, dropout_p=dropout, is_causal=causal, scale=self.scale
            )
            weights = None
        out = out.transpose(1, 2).reshape(q.size(0), q.size(2), -1)  # (B, T, H)
        return self.out_proj(out), weights

    def softmax(self, scores: torch.Tensor) -> torch.Tensor:
        """The attention weights of scores (..., L), masked places -inf."""
        return scores.softmax(-1)


class FeedForward(nn.Sequential):
    """FFN(x) = max(0, x W_1 + b_1) W_2 + b_2 (eq. 2), with dropout on the hidden units."""

    def __init__(self, dim: int, ffn_dim: int, dropout: float):
        super().__init__(nn.Linear(dim, ffn_dim), nn.ReLU(), Dropout(dropout), nn.Linear(ffn_dim, dim))


class Residual(nn.Module):
    """Pre-norm x + Drop(F(LN(x))) or post-norm LN(x + Drop(F(x))) around a sub-layer."""

    def __init__(self, dim: int, dropout: float, norm: str):
        super().__init__()
        self.pre = norm == "pre"
        self.norm = InputNorm(dim) if self.pre else nn.LayerNorm(dim)  # pre: only the sub-layer's products read it
        self.dropout = Dropout(dropout)

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
        x = self.res_attn(x, lambda h: self.attn.self_attend(h, mask=mask)[0])
        return self.res_ffn(x, self.ffn)


class TransformerEncoder(nn.Module):
    def __init__(
        self, embed: Embedding, layers: int, dim: int, heads: int, ffn_dim: int, dropout: float, norm: str, scale: bool
    ):
        super().__init__()
        self.embed = embed
        self.layers = nn.ModuleList(EncoderLayer(dim, heads, ffn_dim, dropout, norm, scale) for _ in range(layers))
        self.final_norm = InputNorm(dim) if norm == "pre" else nn.Identity()

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
        self, x: torch.Tensor, cross_kv: tuple[torch.Tensor, torch.Tensor], src_mask: torch.Tensor, need_weights: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Teacher forcing: x (B, T, H), causal self-attention -> (B, T, H), cross weights (B, N, T, S) or None."""
        x = self.res_self(x, lambda h: self.self_attn.self_attend(h, causal=True)[0])
        return self._cross_and_ffn(x, cross_kv, src_mask, need_weights)

    def step(
        self,
        x: torch.Tensor,
        cache: tuple[torch.Tensor, torch.Tensor],
        cross_kv: tuple[torch.Tensor, torch.Tensor],
        src_mask: torch.Tensor,
        need_weights: bool,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor], torch.Tensor | None]:
        """P positions per row (1 in search; a prefix's in prefill): x (R, P, H) after the cached keys/values
        (R, N, t, D) of the row's earlier positions, each position seeing the cache and the new ones up to itself.

        cross_kv (B, N, S, D) and src_mask (B, 1, 1, S) hold one copy per sentence for its R // B rows.
        Returns the output (R, P, H), the cache extended by these positions (R, N, t + P, D), and the cross
        weights (B, N, R // B * P, S) or None.
        """
        new_cache: list[tuple[torch.Tensor, torch.Tensor]] = []
        t, positions = cache[0].size(2), x.size(1)
        causal = (
            None
            if positions == 1
            else torch.ones(positions, t + positions, dtype=torch.bool, device=x.device).tril(diagonal=t)
        )

        def self_block(h: torch.Tensor) -> torch.Tensor:
            # a few queries per row: explicit products (need_weights) beat SDPA's kernel
            out, _, kv = self.self_attn.self_attend(h, cache, mask=causal, need_weights=True)
            new_cache.append(kv)  # (R, N, t + P, D) each
            return out

        x = self.res_self(x, self_block)
        x, weights = self._cross_and_ffn(x, cross_kv, src_mask, need_weights, explicit=True)
        return x, new_cache[0], weights

    def _cross_and_ffn(
        self,
        x: torch.Tensor,
        cross_kv: tuple[torch.Tensor, torch.Tensor],
        src_mask: torch.Tensor,
        need_weights: bool,
        explicit: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Cross-attention then the feed-forward sub-layer; x (R, T, H),
        a sentence's R // B rows query its keys together.

        explicit: attention as explicit products even without weights asked (faster than SDPA for a step's few queries).
        """
        weights: list[torch.Tensor | None] = []

        def cross_block(h: torch.Tensor) -> torch.Tensor:
            out, w = self.cross_attn.attend(
                by_sentence(h, src_mask.size(0)), *cross_kv, mask=src_mask, need_weights=need_weights or explicit
            )
            weights.append(w if need_weights else None)
            return out.reshape(h.shape)

        x = self.res_cross(x, cross_block)
        return self.res_ffn(x, self.ffn), weights[0]


def reduce_attention(maps: torch.Tensor) -> torch.Tensor:
    """The reduction for plotting: (B, L, N, T, S) per layer and head -> the last layer's mean over heads (B, T, S)."""
    return maps[:, -1].mean(1)


class TransformerDecoder(nn.Module):
    def __init__(
        self,
        embed: Embedding,
        vocab: int,
        layers: int,
        dim: int,
        heads: int,
        ffn_dim: int,
        dropout: float,
        norm: str,
        scale: bool,
        tie_output: bool,
    ):
        super().__init__()
        self.embed = embed
        self.layers = nn.ModuleList(DecoderLayer(dim, heads, ffn_dim, dropout, norm, scale) for _ in range(layers))
        self.final_norm = InputNorm(dim) if norm == "pre" else nn.Identity()
        self.output = nn.Linear(dim, vocab, bias=False)
        if tie_output:
            self.output.weight = embed.tokens.weight

    def _cross_kv(self, enc: Enc) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [layer.cross_attn.keys_values(enc["memory"]) for layer in self.layers]

    def teacher_forced(
        self, tgt_in: torch.Tensor, enc: Enc, attn_layers: range
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The output layer's input (B, T, H) and the cross-attention of the layers asked for
        (B, len(attn_layers), N, T, S), or None."""
        x = self.embed(tgt_in)  # (B, T, H)
        src_mask = enc["src_mask"][:, None, None, :]  # (B, 1, 1, S)
        maps = []
        for i, (layer, cross_kv) in enumerate(zip(self.layers, self._cross_kv(enc))):
            x, weights = layer(x, cross_kv, src_mask, i in attn_layers)
            if weights is not None:
                maps.append(weights)  # (B, N, T, S)
        return self.final_norm(x), torch.stack(maps, 1) if maps else None

    def features(
        self, tgt_in: torch.Tensor, enc: Enc, need_attn: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Teacher forcing: the output layer's input (B, T, H) and, if asked,
        cross-attention reduced for plotting (B, T, S)."""
        last = len(self.layers) - 1
        features, maps = self.teacher_forced(tgt_in, enc, range(last, last + 1) if need_attn else range(0))
        return features, reduce_attention(maps) if need_attn else None

    def forward(
        self, tgt_in: torch.Tensor, enc: Enc, need_attn: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Teacher forcing: logits (B, T, V) and, if asked, cross-attention reduced for plotting (B, T, S)."""
        features, attn = self.features(tgt_in, enc, need_attn)
        return self.output(features), attn

    def attention_maps(self, tgt_in: torch.Tensor, enc: Enc) -> torch.Tensor:
        """Teacher-forced cross-attention of every layer and head (B, L, N, T, S)."""
        return self.teacher_forced(tgt_in, enc, range(len(self.layers)))[1]

    def prepare(self, enc: Enc) -> Enc:
        """enc plus every layer's cross-attention keys and values "cross_k{i}", "cross_v{i}" (B, N, S, D),
        computed once; stored contiguous, so the steps' products read them in place (a head-split view would be
        copied at every step)."""
        prepared = dict(enc)
        for i, (k, v) in enumerate(self._cross_kv(enc)):
            prepared[f"cross_k{i}"], prepared[f"cross_v{i}"] = k.contiguous(), v.contiguous()
        return prepared

    def cross_rows(self, enc: Enc, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer `layer`'s cross-attention keys and values (B, N, S, D), one row per sentence of enc."""
        return enc[f"cross_k{layer}"], enc[f"cross_v{layer}"]

    def init_state(self, enc: Enc) -> State:
        """Empty self-attention caches "self_k{i}", "self_v{i}" (B, N, 0, D) of the keys' dtype,
        one row per sentence (enc from `prepare`)."""
        keys = self.cross_rows(enc, 0)[0]
        empty = keys.new_empty(enc["src_mask"].size(0), keys.size(1), 0, keys.size(3))  # (B, N, 0, D)
        return {f"self_{kv}{i}": empty for i in range(len(self.layers)) for kv in "kv"}

    def step(
        self, prev: torch.Tensor, enc: Enc, state: State, output: nn.Module | None = None
    ) -> tuple[torch.Tensor, State, torch.Tensor]:
        """One token per row: prev (R,) -> logits (R, V), new state, attention (R, S);
        R // B rows per sentence of enc. `output` replaces the output layer (a shortlist's: V its rows)."""
        logits, state, attn = self.prefill(prev[:, None], enc, state, output)
        return logits[:, 0], state, attn[:, 0]

    def prefill(
        self, tokens: torch.Tensor, enc: Enc, state: State, output: nn.Module | None = None
    ) -> tuple[torch.Tensor, State, torch.Tensor]:
        """P tokens per row in one pass (a target prefix; P = 1 is `step`): tokens (R, P) -> logits (R, P, V), the
        state after them, attention (R, P, S) (last layer, mean over heads), as teacher forcing computes them."""
        t = state["self_k0"].size(2)
        rows, positions = tokens.shape
        x = self.embed(tokens, offset=t)  # (R, P, H)
        src_mask = enc["src_mask"][:, None, None, :]  # (B, 1, 1, S)
        new_state: State = {}
        weights = None
        for i, layer in enumerate(self.layers):
            cache = (state[f"self_k{i}"], state[f"self_v{i}"])
            x, (new_state[f"self_k{i}"], new_state[f"self_v{i}"]), weights = layer.step(
                x, cache, self.cross_rows(enc, i), src_mask, i == len(self.layers) - 1
            )
        logits = (output or self.output)(self.final_norm(x))  # (R, P, V)
        # last layer, mean over heads: (B, N, G * P, S) -> (R, P, S)
        return logits, new_state, weights.mean(1).reshape(rows, positions, -1)


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
