"""Transformer encoder-decoder (Vaswani et al. 2017, "Attention Is All You Need").

    Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V                      (eq. 1)
    MultiHead(Q, K, V) = Concat(head_1..head_N) W^O, head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)
    FFN(x) = max(0, x W_1 + b_1) W_2 + b_2                                  (eq. 2)
    PE(pos, 2i) = sin(pos / 10000^(2i/H)), PE(pos, 2i+1) = cos(pos / 10000^(2i/H))
Sub-layers are wrapped pre-norm, x + Drop(F(LN(x))) (Wang et al. 2019), or post-norm, LN(x + Drop(F(x))).

Shape legend: B batch, S source length, T target length, H model dim, V vocab, N heads, D head dim (H / N).
`step` keeps a key/value cache per decoder layer in the state (one row per hypothesis); cross-attention
keys and values are computed once per sentence in `prepare`, and a sentence's rows (its beams) query
them together. `step` and `forward` return cross-attention reduced for plotting
(`reduce_attention`: last layer, mean over heads); `attention_maps` gives every layer and head (B, L, N, T, S).
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
from torch import nn

from nmt.models import native
from nmt.models.dropout import Dropout
from nmt.models.dropout import dropout as drop
from nmt.models.seq2seq import Enc, Seq2Seq, State, by_sentence, room


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


def short_softmax(scores: torch.Tensor) -> torch.Tensor:
    """softmax(-1) of rows shorter than 16 (a step's first keys, a short source), padded to 16 with -inf: torch's
    CPU kernel computes rows shorter than its vector scalar by scalar, 4-5x slower (60 us against 12 for (64, 4,
    1, 15)). The values differ from softmax's in the last bit (a vectorized exp), so only decoding copies of the
    model use it (`MultiHeadAttention.fuse`), never training or its validation."""
    width = scores.size(-1)
    return F.pad(scores, (0, SHORT - width), value=float("-inf")).softmax(-1)[..., :width]


SHORT = 16  # rows of fewer keys than this go through short_softmax; a decoding copy pads its cross-attention keys
# to at least this many (`TransformerDecoder.prepare`), so their scores never need it
FUSED_MAX_ROWS = 128  # an int8 decoding copy's step runs each layer in one call (native.layer_step, where the
# kernels are built with VNNI) on one thread, or with more threads at up to this many rows (measured 2026-12-03,
# Intel Xeon with AMX, 500 test sentences, batches of 64: 1 thread greedy 1.27x, beam 5 1.11x faster than
# torch._int_mm and the kernels around it; 2 threads greedy 1.19x, beam 5 (320 rows) 0.97x unless kept to 128 rows)
ROOM = 16  # positions a decoding copy's self-attention cache is allocated ahead (at least; see `_grown`)


@functools.cache
def state_names(layer: int) -> tuple[str, str, str, str]:
    """A decoder layer's keys in the state and in the encoder output (formatted once, not at every step)."""
    return f"self_k{layer}", f"self_v{layer}", f"cross_k{layer}", f"cross_v{layer}"


class MultiHeadAttention(nn.Module):
    """Multi-head scaled dot-product attention; `scale=False` drops the 1/sqrt(D) factor."""

    decoding = False  # a decoding copy (fused projections, short_softmax): set by `fuse`
    prescaled = False  # the query projection's weights already carry the 1/sqrt(D) factor: set by `fuse`

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
        if hasattr(self, "kv_proj"):
            return self.split_many(self.kv_proj(x), 2)
        return self.split(self.k_proj(x)), self.split(self.v_proj(x))

    def split_many(self, x: torch.Tensor, parts: int) -> tuple[torch.Tensor, ...]:
        """(B, L, parts * H), the outputs of a fused projection -> `parts` views (B, N, L, D)."""
        x = x.view(x.size(0), x.size(1), parts, self.heads, self.head_dim)
        return tuple(x[:, :, i].transpose(1, 2) for i in range(parts))

    def fuse(self, queries: bool) -> None:
        """For decoding: one product instead of three (queries: self-attention, qkv_proj = [Q; K; V]) or two
        (cross-attention, kv_proj = [K; V]); the weights are concatenated by output unit, so each output is the
        same dot product as before (bit-identical on MKL). The separate layers are dropped, and the module becomes a
        decoding copy (`decoding`: short rows' softmax through `short_softmax`)."""
        names = ("q_proj", "k_proj", "v_proj") if queries else ("k_proj", "v_proj")
        if not hasattr(self, names[-1]):
            return  # fused already
        parts = [getattr(self, name) for name in names]
        fused = nn.Linear(parts[0].in_features, sum(p.out_features for p in parts), device=parts[0].weight.device)
        with torch.no_grad():
            fused.weight.copy_(torch.cat([p.weight for p in parts]))
            fused.bias.copy_(torch.cat([p.bias for p in parts]))
        fused.requires_grad_(parts[0].weight.requires_grad)
        for name in names:
            delattr(self, name)
        setattr(self, "qkv_proj" if queries else "kv_proj", fused)
        self.decoding = True
        self._prescale(fused if queries else self.q_proj)

    def _prescale(self, projection: nn.Linear) -> None:
        """Multiply the query rows (the first H outputs) of `projection` by the 1/sqrt(D) factor, so no step
        scales its scores. Only for a power of two (D = 4, 16, 64, 256, ...): then every score is exactly the
        same number as before (a power-of-two factor moves the exponent, never the rounding)."""
        mantissa, _ = math.frexp(self.scale)
        if self.scale == 1.0 or mantissa != 0.5:
            return
        rows = self.heads * self.head_dim
        with torch.no_grad():
            projection.weight[:rows].mul_(self.scale)
            if projection.bias is not None:
                projection.bias[:rows].mul_(self.scale)
        self.prescaled = True

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
        if hasattr(self, "qkv_proj"):
            qkv = self.qkv_proj(x)  # (B, L, 3H)
            if (
                self.decoding
                and cache is None
                and mask is not None
                and mask.dtype == torch.bool
                and not (causal or need_weights or self.training)
                and native.usable(qkv)
                and qkv.is_contiguous()
            ):
                return self._native_self_attend(qkv, mask)
            q, k, v = self.split_many(qkv, 3)
        else:
            q, (k, v) = self.split(self.q_proj(x)), self.keys_values(x)
        if cache is not None:
            k, v = torch.cat([cache[0], k], 2), torch.cat([cache[1], v], 2)
        out, weights = self.attend_projected(q, k, v, mask, causal, need_weights)
        return out, weights, (k, v)

    def _native_self_attend(
        self, qkv: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, None, tuple[torch.Tensor, torch.Tensor]]:
        """A decoding copy's encoder self-attention in one call of the native kernel (nmt.models.native.attend:
        SDPA's CPU kernel spends ~2 ms on a batch of short sentences that this does in a tenth of that; its exp
        differs from torch's in the last bits): qkv (B, L, 3H), mask broadcastable to (B, 1, 1, L), True where a
        key may be attended."""
        sentences, length = qkv.size(0), qkv.size(1)
        _, k, v = self.split_many(qkv, 3)  # (B, N, L, D) views of qkv each, read in place
        bias = torch.zeros(sentences, 1, 1, length).masked_fill_(~mask.expand(sentences, 1, 1, length), float("-inf"))
        scale = 1.0 if self.prescaled else self.scale
        out, _ = native.attend(qkv.view(sentences * length, -1), k, v, bias, scale, False)  # (B * L, H)
        return self.out_proj(out.view(sentences, length, -1)), None, (k, v)

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
        """`attend` for projected queries q (B, N, T, D)."""
        dropout = self.dropout if self.training else 0.0
        scale = 1.0 if self.prescaled else self.scale
        if need_weights or explicit_products(q, dropout):
            scores = q @ k.transpose(-2, -1)  # (B, N, T, L)
            if scale != 1.0:
                scores = scores * scale
            if causal:
                mask = torch.ones(q.size(2), k.size(2), dtype=torch.bool, device=q.device).tril()
            if mask is not None:
                scores = scores.masked_fill(~mask, float("-inf"))
            weights = short_softmax(scores) if self.decoding and scores.size(-1) < SHORT else scores.softmax(-1)
            out = drop(weights, dropout, self.training) @ v
            weights = weights if need_weights else None
        else:
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, dropout_p=dropout, is_causal=causal, scale=scale
            )
            weights = None
        out = out.transpose(1, 2).reshape(q.size(0), q.size(2), -1)  # (B, T, H)
        return self.out_proj(out), weights


class FeedForward(nn.Sequential):
    def __init__(self, dim: int, ffn_dim: int, dropout: float):
        super().__init__(nn.Linear(dim, ffn_dim), nn.ReLU(), Dropout(dropout), nn.Linear(ffn_dim, dim))


class Residual(nn.Module):
    """Pre-norm x + Drop(F(LN(x))) or post-norm LN(x + Drop(F(x))) around a sub-layer."""

    def __init__(self, dim: int, dropout: float, norm: str):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.pre = norm == "pre"
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

    def fuse_projections(self) -> None:
        self.attn.fuse(queries=True)


class TransformerEncoder(nn.Module):
    def __init__(
        self, embed: Embedding, layers: int, dim: int, heads: int, ffn_dim: int, dropout: float, norm: str, scale: bool
    ):
        super().__init__()
        self.embed = embed
        self.layers = nn.ModuleList(EncoderLayer(dim, heads, ffn_dim, dropout, norm, scale) for _ in range(layers))
        self.final_norm = nn.LayerNorm(dim) if norm == "pre" else nn.Identity()

    def forward(self, src: torch.Tensor, src_mask: torch.Tensor) -> Enc:
        if self.layers and self.layers[0].attn.decoding and not self.training:
            memory = self._whole(src, src_mask)
            if memory is not None:
                return {"memory": memory, "src_mask": src_mask}
        x = self.embed(src)  # (B, S, H)
        mask = src_mask[:, None, None, :]  # (B, 1, 1, S)
        for layer in self.layers:
            x = layer(x, mask)
        return {"memory": self.final_norm(x), "src_mask": src_mask}

    def _whole(self, src: torch.Tensor, src_mask: torch.Tensor) -> torch.Tensor | None:
        """A decoding copy's forward in one native call (`native.encoder_forward`): the embedding, every layer and
        the final norm -> the memory (B, S, H); None where a part is not the kernels' (then each module runs).
        The modules took 1.23x (int8) and 1.11x (fp32) this call's time to encode test2016's 1,000 sentences in
        batches of 64 (one thread, Zen 4, median of 7)."""
        embed, weight = self.embed, self.embed.tokens.weight
        length = src.size(1)
        if (
            not length
            or length > embed.positions.size(0)
            or src.dtype != torch.long
            or src_mask.dtype != torch.bool
            or not native.usable(weight)
            or not weight.is_contiguous()
        ):
            return None
        norm = native_norm(self.final_norm)
        made = [native.layer8(layer) or native.layer32(layer) for layer in self.layers]
        if norm is False or None in made or len({type(m[0]) for m in made}) != 1:
            return None
        bias = torch.zeros(src_mask.shape).masked_fill_(~src_mask, float("-inf"))  # (B, S)
        return native.encoder_forward(
            made, src.contiguous(), weight, math.sqrt(embed.dim), embed.positions[:length], bias, norm
        )


def native_norm(norm: nn.Module) -> tuple[torch.Tensor, torch.Tensor, float] | None | bool:
    """A final norm as the native whole-stack calls take it: (weight, bias, eps) for a LayerNorm with both, None for
    none (post-norm's Identity), False where they cannot."""
    if isinstance(norm, nn.Identity):
        return None
    if isinstance(norm, nn.LayerNorm) and norm.weight is not None and norm.bias is not None:
        return norm.weight, norm.bias, norm.eps
    return False


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

    def fuse_projections(self) -> None:
        self.self_attn.fuse(queries=True)
        self.cross_attn.fuse(queries=False)

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

    def fused(self, rows: int) -> tuple | None:
        """This layer as native.layer_step takes it for a step of `rows` rows (`native.layer8`, int8: single-threaded
        products, or with more threads up to FUSED_MAX_ROWS rows; else `native.layer32`, fp32), or None."""
        made = native.layer8(self)
        if made is not None and not (rows <= FUSED_MAX_ROWS or torch.get_num_threads() == 1 or native.amx()):
            made = None
        return made or native.layer32(self)

    def step_one(
        self,
        x: torch.Tensor,
        cache: tuple[torch.Tensor, torch.Tensor],
        t: int,
        cross_kv: tuple[torch.Tensor, torch.Tensor],
        cross_bias: torch.Tensor,
        need_weights: bool,
        anc: torch.Tensor | None = None,
        cross_slots: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`step` for one position per row in a decoding copy: x (R, 1, H); the row's key and value are written
        at position t of the caches (R, N, >= t + 1, D), whose first t positions hold the earlier ones; with anc
        (R, t + 1) int64 (the native kernels only), row r's are written at position t of slot r of the caches
        (>= R, N, >= t + 1, D) and position j is read from slot anc[r, j] (`TransformerDecoder._shared`); with
        cross_slots (B,) int64 (the native kernels only), sentence b's cross-attention keys and values are those at
        index cross_slots[b] (`TransformerDecoder.prepare`). The
        cross-attention keys/values (B, N, W, D) are padded to W >= SHORT positions, and cross_bias (B, 1, 1, W)
        is 0 where a key may be attended and -inf elsewhere (source padding, the positions added). The same
        numbers as `step` (masked_fill and the short rows' padding are the same -inf), fewer operations: no
        cache concatenation, no mask inversion, no scaling (`MultiHeadAttention.prescaled`). Where the fused CPU
        kernels are built (nmt.models.native) both attentions run in one call each (their exp differs from torch's
        in the last bits).
        Returns x (R, 1, H) and the cross weights (B, N, R // B, W) or None."""
        rows = x.size(0)
        keys, values = cache
        kept: list[torch.Tensor | None] = []

        fused = (
            native.usable(x, keys, values, *cross_kv, cross_bias)
            and cross_kv[0].is_contiguous()
            and cross_kv[1].is_contiguous()
        )
        if fused and keys.stride(2) == keys.size(3) and x.is_contiguous():  # the layer in one call
            made = self.fused(rows)
            if made is not None:
                return native.layer_step(
                    made, x, keys, values, t, *cross_kv, cross_bias, need_weights, anc, cross_slots
                )

        def self_block(h: torch.Tensor) -> torch.Tensor:
            att = self.self_attn
            qkv = att.qkv_proj(h)  # (R, 1, 3H)
            if fused and qkv.is_contiguous() and keys.stride(3) == 1 and keys.stride(2) == att.head_dim:
                scale = 1.0 if att.prescaled else att.scale
                out = native.self_attend(qkv.view(rows, -1), keys, values, t, scale, anc)
                return att.out_proj(out.view(rows, 1, -1))
            if anc is not None:
                raise RuntimeError("caches indexed by ancestors need the native kernels")
            q, k, v = qkv.view(rows, 3, att.heads, att.head_dim).unbind(1)  # (R, N, D) each
            keys[:, :, t] = k
            values[:, :, t] = v
            scores = q[:, :, None] @ keys[:, :, : t + 1].transpose(-2, -1)  # (R, N, 1, t + 1)
            if not att.prescaled:
                scores = scores * att.scale
            weights = short_softmax(scores) if t + 1 < SHORT else scores.softmax(-1)
            return att.out_proj((weights @ values[:, :, : t + 1]).view(rows, 1, -1))

        def cross_block(h: torch.Tensor) -> torch.Tensor:
            att, (k, v) = self.cross_attn, cross_kv
            sentences = k.size(0)
            if fused:
                scale = 1.0 if att.prescaled else att.scale
                q = att.q_proj(h).view(rows, -1)
                out, weights = native.attend(q, k, v, cross_bias, scale, need_weights, cross_slots)
                kept.append(weights)
                return att.out_proj(out.view(rows, 1, -1))
            if cross_slots is not None:
                raise RuntimeError("cross-attention keys indexed by slots need the native kernels")
            q = att.q_proj(h).view(sentences, rows // sentences, att.heads, att.head_dim).transpose(1, 2)  # (B,N,G,D)
            scores = q @ k.transpose(-2, -1)  # (B, N, G, W)
            if not att.prescaled:
                scores = scores * att.scale
            weights = (scores + cross_bias).softmax(-1)
            kept.append(weights if need_weights else None)
            return att.out_proj((weights @ v).transpose(1, 2).reshape(rows, 1, -1))

        x = self.res_self(x, self_block)
        x = self.res_cross(x, cross_block)
        return self.res_ffn(x, self.ffn), kept[0]

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
        self.final_norm = nn.LayerNorm(dim) if norm == "pre" else nn.Identity()
        self.output = nn.Linear(dim, vocab, bias=False)
        if tie_output:
            self.output.weight = embed.tokens.weight

    def _cross_kv(self, enc: Enc) -> list[tuple[torch.Tensor, torch.Tensor]]:
        memory = enc["memory"] if "memory" in enc else enc["shared_memory"].index_select(0, enc["cross_slot"])
        return [layer.cross_attn.keys_values(memory) for layer in self.layers]

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
        computed once.

        Stored contiguous, so the steps' products read them in place (a head-split view would be copied at every step).
        A decoding copy (`decoding`) pads them with zeros to at least SHORT positions and adds "cross_bias"
        (B, 1, 1, W): 0 where a key may be attended, -inf at source padding and the added positions. On the
        native kernels it keeps them, and the memory, as "shared_cross_k{i}", "shared_cross_v{i}",
        "shared_memory", which `reorder` passes through (sentences leaving the batch copied all of them), with
        "cross_slot" (B,): the index of each sentence's there (`cross_rows` gives them per sentence).
        """
        prepared = dict(enc)
        src_mask = enc["src_mask"]  # (B, S)
        extra = max(SHORT - src_mask.size(1), 0) if self.decoding else 0
        shared = self.decoding and native.usable(enc["memory"])
        name = "shared_cross_" if shared else "cross_"
        for i, (k, v) in enumerate(self._cross_kv(enc)):
            if extra:
                k, v = F.pad(k, (0, 0, 0, extra)), F.pad(v, (0, 0, 0, extra))
            prepared[f"{name}k{i}"], prepared[f"{name}v{i}"] = k.contiguous(), v.contiguous()
        if self.decoding:
            allowed = F.pad(src_mask, (0, extra), value=False)[:, None, None, :]  # (B, 1, 1, W)
            bias = torch.zeros(allowed.shape, dtype=prepared[f"{name}k0"].dtype, device=src_mask.device)
            prepared["cross_bias"] = bias.masked_fill_(~allowed, float("-inf"))
        if shared:
            prepared["shared_memory"] = prepared.pop("memory")
            prepared["cross_slot"] = torch.arange(src_mask.size(0), device=src_mask.device)
        return prepared

    def cross_rows(self, enc: Enc, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer `layer`'s cross-attention keys and values (B, N, W, D), one row per sentence of enc."""
        if "cross_slot" not in enc:
            return enc[f"cross_k{layer}"], enc[f"cross_v{layer}"]
        slots = enc["cross_slot"]
        return tuple(enc[f"shared_cross_{kv}{layer}"].index_select(0, slots) for kv in "kv")

    @property
    def decoding(self) -> bool:
        """Whether this is a decoding copy (fused projections: `to_precision`), which steps through `step_one`."""
        return bool(self.layers) and self.layers[0].cross_attn.decoding

    def init_state(self, enc: Enc) -> State:
        """Empty self-attention caches "self_k{i}", "self_v{i}" (B, N, 0, D) of the keys' dtype,
        one row per sentence (enc from `prepare`). A decoding copy's are views of buffers with ROOM positions
        allocated, with "self_end" (B,): how many positions of those buffers hold keys (see `_grown`)."""
        keys = enc["shared_cross_k0"] if "cross_slot" in enc else enc["cross_k0"]
        empty = keys.new_empty(enc["src_mask"].size(0), keys.size(1), 0, keys.size(3))  # (B, N, 0, D)
        if self.decoding:
            return self._grown(empty, {}, 0)
        return {f"self_{kv}{i}": empty for i in range(len(self.layers)) for kv in "kv"}

    def _grown(self, like: torch.Tensor, state: State, t: int) -> State:
        """The caches of `state` (t positions, or none: `like` gives the shape) copied into new buffers with room for
        at least ROOM more positions, as views of their first t; "self_end" (R,) says t are written.

        A step writes its keys in place at position t when the caches' buffers have room and "self_end" says that
        exactly t positions are written (this state is the buffers' latest); a state stepped a second time, or
        one whose buffers are full or were not made here, is grown first. `seq2seq.reorder` keeps the room."""
        rows, heads, _, dim = like.shape
        room = t + max(ROOM, t // 2)
        grown: State = {}
        for i in range(len(self.layers)):
            for kv in "kv":
                buffer = like.new_empty(rows, heads, room, dim)
                if t:
                    buffer[:, :, :t] = state[f"self_{kv}{i}"]
                grown[f"self_{kv}{i}"] = buffer[:, :, :t]
        grown["self_end"] = torch.full((rows,), t, dtype=torch.long, device=like.device)
        return grown

    def _shared(self, state: State, t: int, rows: int) -> tuple[torch.Tensor, list[torch.Tensor], torch.Tensor]:
        """For a step of `rows` rows at position t on the native kernels: the rows' ancestors (R, t) int64, the
        caches' buffers [k0, v0, k1, v1, ...] (slots >= rows, N, room > t, D) and "shared_end" (1,), the positions
        of those buffers written.

        Beam search reorders the state after every step, and copying every layer's cache to follow the beams was
        the largest memory traffic of a step. Instead the buffers are shared, never reordered (`reorder` passes
        "shared_" entries through): position j of slot s holds the keys that row s of step j wrote, and
        "self_anc" (R, t), which is reordered, says which slot holds each position of a row's history. A step
        writes row r's keys at position t of slot r. It does so in place when the buffers are this state's latest
        (shared_end == t: no other state has written position t), have room, and have a slot for every row;
        otherwise positions 0..t-1 are copied into new buffers first (anc stays valid: slots keep their index).
        A state with per-row caches (`init_state`, a prefix's `prefill`) becomes this with anc[r, j] = r."""
        if "self_anc" in state:
            anc, end = state["self_anc"], state["shared_end"]
            buffers = [state[f"shared_{kv}{i}"] for i in range(len(self.layers)) for kv in "kv"]
            if int(end) == t and buffers[0].size(0) >= rows and buffers[0].size(2) > t:
                return anc, buffers, end
        else:  # per-row caches: empty (init_state) or a prefix's, copied once into shared buffers
            keys = state["self_k0"]
            anc = torch.arange(keys.size(0), device=keys.device)[:, None].expand(-1, t).contiguous()
            buffers = [state[f"self_{kv}{i}"] for i in range(len(self.layers)) for kv in "kv"]
        slots, heads, _, dim = buffers[0].shape
        slots = max(slots, rows)
        positions = buffers[0].size(2) if buffers[0].size(2) > t else t + max(ROOM, t // 2)
        grown = []
        for old in buffers:
            new = old.new_empty(slots, heads, positions, dim)
            new[: old.size(0), :, :t] = old[:, :, :t]
            grown.append(new)
        return anc, grown, torch.full((1,), t, dtype=torch.long, device=anc.device)

    def _whole_step(
        self, tokens: torch.Tensor, enc: Enc, buffers: list[torch.Tensor], t: int, anc: torch.Tensor, width: int
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """`prefill` of one token per row (R,) on shared caches in one native call (`native.decoder_step`): the
        embedding, every layer's `step_one` and the final norm -> (R, H), and the attention (R, S); None where a
        part is not the kernels' (then each layer steps on its own). This call against each layer's from Python,
        alternating in one process on test2016's 1,000 sentences (Zen 4): greedy 1.17x (int8 with a shortlist),
        1.12x (int8), 1.05x (fp32) on one thread; int8 beam 5 1.05x on two."""
        embed, norm = self.embed, self.final_norm
        rows = tokens.numel()
        if t >= embed.positions.size(0) or not embed.tokens.weight.is_contiguous() or tokens.dtype != torch.long:
            return None
        tokens = tokens.contiguous()  # (a column of a batch's targets is strided)
        norm_args = native_norm(norm)
        made = [layer.fused(rows) for layer in self.layers]
        kinds = {type(m[0]) for m in made if m is not None}
        if (
            norm_args is False
            or not made
            or None in made
            or len(kinds) != 1
            or buffers[0].stride(2) != buffers[0].size(3)
        ):
            return None
        cross = [enc[f"shared_cross_{kv}{i}"] for i in range(len(self.layers)) for kv in "kv"]
        return native.decoder_step(
            made,
            tokens,
            embed.tokens.weight,
            math.sqrt(embed.dim),
            embed.positions[t],
            buffers,
            t,
            cross,
            enc["cross_bias"],
            anc,
            enc["cross_slot"],
            norm_args,
            width,
        )

    def caches(self, state: State) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each layer's self-attention keys and values per row (R, N, t, D), whichever form the state holds."""
        if "self_anc" not in state:
            return [(state[f"self_k{i}"], state[f"self_v{i}"]) for i in range(len(self.layers))]
        anc = state["self_anc"]  # (R, t)
        positions = torch.arange(anc.size(1), device=anc.device)
        return [
            tuple(state[f"shared_{kv}{i}"][anc, :, positions].transpose(1, 2) for kv in "kv")  # (R, N, t, D)
            for i in range(len(self.layers))
        ]

    def _per_row(self, state: State) -> State:
        """A state of shared caches (`_shared`) as per-row caches "self_k{i}", "self_v{i}" (R, N, t, D)."""
        per_row: State = {}
        for i, (k, v) in enumerate(self.caches(state)):
            per_row[f"self_k{i}"], per_row[f"self_v{i}"] = k, v
        return per_row

    def _writable(self, state: State, t: int) -> bool:
        """Whether a step may write position t of `state`'s cache buffers in place (see `_grown`)."""
        end = state.get("self_end")
        return end is not None and end.numel() > 0 and int(end[0]) == t and room(state["self_k0"]) > t

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
        t = state["self_anc"].size(1) if "self_anc" in state else state["self_k0"].size(2)
        rows, positions = tokens.shape
        width = enc["src_mask"].size(1)  # S
        new_state: State = {}
        weights = None
        if positions == 1 and self.decoding and not self.training:  # step_one: no attention dropout
            last = len(self.layers) - 1
            slots = enc.get("cross_slot")
            # nothing reordered (`_shared`, `prepare`); the embedding's output has its weight's dtype
            if slots is not None and native.usable(self.embed.tokens.weight, enc["cross_bias"]):
                anc, buffers, end = self._shared(state, t, rows)
                anc = torch.cat([anc, torch.arange(rows, device=anc.device)[:, None]], 1)  # (R, t + 1)
                for i in range(len(self.layers)):
                    new_state[f"shared_k{i}"], new_state[f"shared_v{i}"] = buffers[2 * i], buffers[2 * i + 1]
                new_state["self_anc"], new_state["shared_end"] = anc, end.fill_(t + 1)
                whole = self._whole_step(tokens[:, 0], enc, buffers, t, anc, width)
                if whole is not None:
                    x, attn = whole  # (R, H) after the final norm, (R, S)
                    return (output or self.output)(x)[:, None], new_state, attn[:, None]
                x = self.embed(tokens, offset=t)  # (R, 1, H)
                for i, layer in enumerate(self.layers):
                    k_name, v_name, ck_name, cv_name = state_names(i)
                    cross = (enc["shared_" + ck_name], enc["shared_" + cv_name])
                    x, weights = layer.step_one(
                        x, (buffers[2 * i], buffers[2 * i + 1]), t, cross, enc["cross_bias"], i == last, anc, slots
                    )
            else:
                x = self.embed(tokens, offset=t)
                if "self_anc" in state:
                    state = self._per_row(state)
                if not self._writable(state, t):
                    state = self._grown(state["self_k0"], state, t)
                for i, layer in enumerate(self.layers):
                    k_name, v_name, ck_name, cv_name = state_names(i)
                    keys, values = state[k_name], state[v_name]
                    shape = (keys.size(0), keys.size(1), t + 1, keys.size(3))
                    buffers = (keys.as_strided(shape, keys.stride()), values.as_strided(shape, values.stride()))
                    cross = self.cross_rows(enc, i)
                    x, weights = layer.step_one(x, buffers, t, cross, enc["cross_bias"], i == last)
                    new_state[k_name], new_state[v_name] = buffers
                new_state["self_end"] = state["self_end"].fill_(t + 1)
        else:
            x = self.embed(tokens, offset=t)  # (R, P, H)
            if "self_anc" in state:
                state = self._per_row(state)
            src_mask = enc["src_mask"][:, None, None, :]  # (B, 1, 1, S)
            for i, layer in enumerate(self.layers):
                cache = (state[f"self_k{i}"], state[f"self_v{i}"])
                cross = tuple(kv[:, :, :width] for kv in self.cross_rows(enc, i))
                x, (new_state[f"self_k{i}"], new_state[f"self_v{i}"]), weights = layer.step(
                    x, cache, cross, src_mask, i == len(self.layers) - 1
                )
        logits = (output or self.output)(self.final_norm(x))  # (R, P, V)
        # last layer, mean over heads: (B, N, G * P, S) -> (R, P, S)
        return logits, new_state, weights[..., :width].mean(1).reshape(rows, positions, -1)


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
