"""A trained Transformer's decoding copy: the model of nmt.models.transformer with the changes that make decoding
fast and leave its numbers those of the model (to float rounding), and the engine's one fast step.

What changes, module by module (`copy_encoder`, `copy_decoder`):
    attention     the projections that read the same input fused into one product (self-attention [Q; K; V],
                  cross-attention [K; V]; each output the same dot product as before); the 1/sqrt(D) factor moved
                  into the query rows of the weights where it is a power of two (then every score is the same
                  number); rows of fewer than SHORT keys through `short_softmax`; an encoder's self-attention
                  through native.attend where the kernels are built
    encoder       the whole stack in one native call (native.encoder_forward) where every layer is the kernels'
    decoder       cross-attention keys padded to at least SHORT positions, with a bias row instead of the mask;
                  where the whole step is the kernels' (every layer `layers.fused`), one native call per step
                  (native.decoder_step) over caches shared by the rows and never reordered (`_shared`); elsewhere
                  the model's own `step` over these converted modules
The linear layers themselves become their precision's (nmt.engine.quantize.convert_linears).

Why subclasses, built from a trained module (`of`), rather than a wrapper holding the model: the plain `step` of
nmt.models.transformer then runs unchanged on the converted modules (a DecoderLayer calls its attention's
`self_attend` and `attend`, which these classes override), so the engine owns one fast step of its own (the native
call) and falls back to the reference for everything else; a wrapper would have had to re-implement or reach into
the layers' step. The copy keeps the model's module tree (and its parameter names, but for the fused projections),
so the native structs (nmt.engine.layers) find every tensor where the model keeps it. Nothing per batch lives on
a module: the shared caches and their row ancestors travel in the state ("shared_*" entries pass through
`reorder`), the padded keys and the bias in the encoder output.

Shape legend: B sentences, R rows (R // B per sentence), S source length, W cross-attention keys (S padded to at
least SHORT), t positions decoded, H model dim, N heads, D head dim, V vocab.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from nmt.engine import native
from nmt.engine.layers import fused, layer8, layer32, native_norm, refresh
from nmt.models import transformer
from nmt.models.seq2seq import Enc, State

SHORT = 16  # rows of fewer keys than this go through short_softmax; a decoding copy pads its cross-attention keys
# to at least this many (`TransformerDecoder.prepare`), so their scores never need it
ROOM = 16  # positions the shared caches are allocated ahead (at least; see `TransformerDecoder._shared`)


def short_softmax(scores: torch.Tensor) -> torch.Tensor:
    """softmax(-1) of rows shorter than SHORT (a step's first keys, a short source), padded to SHORT with -inf:
    torch's CPU kernel computes rows shorter than its vector scalar by scalar, 4-5x slower (60 us against 12 for
    (64, 4, 1, 15)). The values differ from softmax's in the last bit (a vectorized exp), so only decoding copies
    use it, never training or its validation."""
    width = scores.size(-1)
    return F.pad(scores, (0, SHORT - width), value=float("-inf")).softmax(-1)[..., :width]


class DecodingAttention(transformer.MultiHeadAttention):
    """A decoding copy's attention: fused projections (the subclasses), prescaled queries, short rows' softmax."""

    fused_names: tuple[str, ...] = ()  # the trained module's projections that become one
    fused_name = ""

    @classmethod
    def of(cls, trained: transformer.MultiHeadAttention) -> DecodingAttention:
        """The decoding copy of a trained attention: its projections in `fused_names` concatenated by output unit
        into one (`fused_name`), the others (out_proj, a cross-attention's q_proj) taken over as they are."""
        copy = cls.__new__(cls)
        nn.Module.__init__(copy)
        copy.heads, copy.head_dim, copy.scale, copy.dropout = (
            trained.heads,
            trained.head_dim,
            trained.scale,
            trained.dropout,
        )
        for name, child in trained.named_children():
            if name not in cls.fused_names:
                setattr(copy, name, child)
        parts = [getattr(trained, name) for name in cls.fused_names]
        linear = nn.Linear(parts[0].in_features, sum(p.out_features for p in parts), device=parts[0].weight.device)
        with torch.no_grad():
            linear.weight.copy_(torch.cat([p.weight for p in parts]))
            linear.bias.copy_(torch.cat([p.bias for p in parts]))
        linear.requires_grad_(parts[0].weight.requires_grad)
        setattr(copy, cls.fused_name, linear)
        copy.prescale(getattr(copy, "q_proj", linear))
        return copy.train(trained.training)

    def prescale(self, projection: nn.Linear) -> None:
        """Multiply the query rows (the first H outputs) of `projection` by the 1/sqrt(D) factor, so no step
        scales its scores (`scale` becomes 1). Only for a power of two (D = 4, 16, 64, 256, ...): then every score
        is exactly the same number as before (a power-of-two factor moves the exponent, never the rounding)."""
        mantissa, _ = math.frexp(self.scale)
        if self.scale == 1.0 or mantissa != 0.5:
            return
        rows = self.heads * self.head_dim
        with torch.no_grad():
            projection.weight[:rows].mul_(self.scale)
            if projection.bias is not None:
                projection.bias[:rows].mul_(self.scale)
        self.scale = 1.0

    def softmax(self, scores: torch.Tensor) -> torch.Tensor:
        return short_softmax(scores) if scores.size(-1) < SHORT else scores.softmax(-1)

    def split_many(self, x: torch.Tensor, parts: int) -> tuple[torch.Tensor, ...]:
        """(B, L, parts * H), the outputs of a fused projection -> `parts` views (B, N, L, D)."""
        x = x.view(x.size(0), x.size(1), parts, self.heads, self.head_dim)
        return tuple(x[:, :, i].transpose(1, 2) for i in range(parts))


class SelfAttention(DecodingAttention):
    """Self-attention with qkv_proj = [Q; K; V]; an encoder's through the native kernel where it is built."""

    fused_names, fused_name = ("q_proj", "k_proj", "v_proj"), "qkv_proj"

    def projections(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.split_many(self.qkv_proj(x), 3)

    def self_attend(
        self,
        x: torch.Tensor,
        cache: tuple[torch.Tensor, torch.Tensor] | None = None,
        mask: torch.Tensor | None = None,
        causal: bool = False,
        need_weights: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None, tuple[torch.Tensor, torch.Tensor]]:
        if (
            cache is None
            and mask is not None
            and mask.dtype == torch.bool
            and not (causal or need_weights or self.training)
            and native.usable(x)
        ):
            qkv = self.qkv_proj(x)  # (B, L, 3H)
            if native.usable(qkv) and qkv.is_contiguous():
                return self._native_self_attend(qkv, mask)
        return super().self_attend(x, cache, mask, causal, need_weights)

    def _native_self_attend(
        self, qkv: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, None, tuple[torch.Tensor, torch.Tensor]]:
        """An encoder's self-attention in one call of the native kernel (native.attend: SDPA's CPU kernel spends
        ~2 ms on a batch of short sentences that this does in a tenth of that; its exp differs from torch's in the
        last bits): qkv (B, L, 3H), mask broadcastable to (B, 1, 1, L), True where a key may be attended."""
        sentences, length = qkv.size(0), qkv.size(1)
        _, k, v = self.split_many(qkv, 3)  # (B, N, L, D) views of qkv each, read in place
        bias = torch.zeros(sentences, 1, 1, length).masked_fill_(~mask.expand(sentences, 1, 1, length), float("-inf"))
        out, _ = native.attend(qkv.view(sentences * length, -1), k, v, bias, self.scale, False)  # (B * L, H)
        return self.out_proj(out.view(sentences, length, -1)), None, (k, v)


class CrossAttention(DecodingAttention):
    """Cross-attention with kv_proj = [K; V] (the queries keep their own projection)."""

    fused_names, fused_name = ("k_proj", "v_proj"), "kv_proj"

    def keys_values(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.split_many(self.kv_proj(x), 2)


class TransformerEncoder(transformer.TransformerEncoder):
    """The encoder of a decoding copy: the stack in one native call where the kernels take every layer."""

    @classmethod
    def of(cls, trained: transformer.TransformerEncoder) -> TransformerEncoder:
        copy = cls.__new__(cls)
        nn.Module.__init__(copy)
        copy.embed, copy.layers, copy.final_norm = trained.embed, trained.layers, trained.final_norm
        for layer in copy.layers:
            layer.attn = SelfAttention.of(layer.attn)
        return copy.train(trained.training)

    def forward(self, src: torch.Tensor, src_mask: torch.Tensor) -> Enc:
        if not self.training:
            memory = self._whole(src, src_mask)
            if memory is not None:
                return {"memory": memory, "src_mask": src_mask}
        return super().forward(src, src_mask)

    def _whole(self, src: torch.Tensor, src_mask: torch.Tensor) -> torch.Tensor | None:
        """The forward in one native call (`native.encoder_forward`): the embedding, every layer and the final norm
        -> the memory (B, S, H); None where a part is not the kernels' (then each module runs). The modules took
        1.23x (int8) and 1.11x (fp32) this call's time to encode test2016's 1,000 sentences in batches of 64 (one
        thread, Zen 4, median of 7)."""
        embed, weight = self.embed, self.embed.tokens.weight
        length = src.size(1)
        refresh(self.layers)
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
        made = [layer8(layer) or layer32(layer) for layer in self.layers]
        if norm is False or None in made or len({type(m[0]) for m in made}) != 1:
            return None
        bias = torch.zeros(src_mask.shape).masked_fill_(~src_mask, float("-inf"))  # (B, S)
        return native.encoder_forward(
            made, src.contiguous(), weight, math.sqrt(embed.dim), embed.positions[:length], bias, norm
        )


class TransformerDecoder(transformer.TransformerDecoder):
    """The decoder of a decoding copy: padded cross-attention keys, and the one fast step (`prefill`)."""

    @classmethod
    def of(cls, trained: transformer.TransformerDecoder) -> TransformerDecoder:
        copy = cls.__new__(cls)
        nn.Module.__init__(copy)
        copy.embed, copy.layers, copy.final_norm = trained.embed, trained.layers, trained.final_norm
        copy.output = trained.output
        for layer in copy.layers:
            layer.self_attn, layer.cross_attn = SelfAttention.of(layer.self_attn), CrossAttention.of(layer.cross_attn)
        return copy.train(trained.training)

    def _cross_kv(self, enc: Enc) -> list[tuple[torch.Tensor, torch.Tensor]]:
        memory = enc["memory"] if "memory" in enc else enc["shared_memory"].index_select(0, enc["cross_slot"])
        return [layer.cross_attn.keys_values(memory) for layer in self.layers]

    def prepare(self, enc: Enc) -> Enc:
        """enc plus every layer's cross-attention keys and values (B, N, W, D), padded with zeros to at least SHORT
        positions, and "cross_bias" (B, 1, 1, W): 0 where a key may be attended, -inf at source padding and the
        added positions. On the native kernels they, and the memory, are kept as "shared_cross_k{i}",
        "shared_cross_v{i}", "shared_memory", which `reorder` passes through (sentences leaving the batch copy none
        of them), with "cross_slot" (B,): the index of each sentence's there; else as "cross_k{i}", "cross_v{i}"."""
        prepared = dict(enc)
        src_mask = enc["src_mask"]  # (B, S)
        refresh(self.layers)  # structs made again for layers whose parameters changed since the last search
        extra = max(SHORT - src_mask.size(1), 0)
        shared = native.usable(enc["memory"])
        name = "shared_cross_" if shared else "cross_"
        for i, (k, v) in enumerate(self._cross_kv(enc)):
            if extra:
                k, v = F.pad(k, (0, 0, 0, extra)), F.pad(v, (0, 0, 0, extra))
            prepared[f"{name}k{i}"], prepared[f"{name}v{i}"] = k.contiguous(), v.contiguous()
        allowed = F.pad(src_mask, (0, extra), value=False)[:, None, None, :]  # (B, 1, 1, W)
        bias = torch.zeros(allowed.shape, dtype=prepared[f"{name}k0"].dtype, device=src_mask.device)
        prepared["cross_bias"] = bias.masked_fill_(~allowed, float("-inf"))
        if shared:
            prepared["shared_memory"] = prepared.pop("memory")
            prepared["cross_slot"] = torch.arange(src_mask.size(0), device=src_mask.device)
        return prepared

    def cross_rows(self, enc: Enc, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer `layer`'s cross-attention keys and values (B, N, S, D), one row per sentence of enc, without the
        padding `prepare` added (the model's step masks with src_mask)."""
        width = enc["src_mask"].size(1)
        if "cross_slot" not in enc:
            return enc[f"cross_k{layer}"][:, :, :width], enc[f"cross_v{layer}"][:, :, :width]
        slots = enc["cross_slot"]
        return tuple(enc[f"shared_cross_{kv}{layer}"][:, :, :width].index_select(0, slots) for kv in "kv")

    def prefill(
        self, tokens: torch.Tensor, enc: Enc, state: State, output: nn.Module | None = None
    ) -> tuple[torch.Tensor, State, torch.Tensor]:
        """The model's `prefill`, one token per row (a search's step) in one native call where the kernels take the
        whole step (`_whole_step`); anything else (a prefix, a layer the kernels do not take, no kernels) through
        the model's own prefill on these modules, with the rows' caches as per-row tensors."""
        if tokens.size(1) == 1 and not self.training:
            found = self._whole_step(tokens[:, 0], enc, state)
            if found is not None:
                x, new_state, attn = found  # (R, H) after the final norm, the state, (R, S)
                return (output or self.output)(x)[:, None], new_state, attn[:, None]
        if "self_anc" in state:
            state = self._per_row(state)
        return super().prefill(tokens, enc, state, output)

    def _whole_step(
        self, tokens: torch.Tensor, enc: Enc, state: State
    ) -> tuple[torch.Tensor, State, torch.Tensor] | None:
        """One token per row (R,) on the shared caches (`_shared`) in one native call (`native.decoder_step`): the
        embedding, every layer and the final norm -> (R, H), the new state, and the attention (R, S); None where a
        part is not the kernels' (then the model's step runs). This call against each layer's from Python,
        alternating in one process on test2016's 1,000 sentences (Zen 4): greedy 1.17x (int8 with a shortlist),
        1.12x (int8), 1.05x (fp32) on one thread; int8 beam 5 1.05x on two."""
        embed, rows = self.embed, tokens.numel()
        t = state["self_anc"].size(1) if "self_anc" in state else state["self_k0"].size(2)
        if (
            "cross_slot" not in enc
            or t >= embed.positions.size(0)
            or tokens.dtype != torch.long
            or not embed.tokens.weight.is_contiguous()
            or not native.usable(embed.tokens.weight, enc["cross_bias"])
        ):
            return None
        norm = native_norm(self.final_norm)
        made = [fused(layer, rows) for layer in self.layers]
        if norm is False or not made or None in made or len({type(m[0]) for m in made}) != 1:
            return None
        anc, buffers, end = self._shared(state, t, rows, enc["src_mask"].size(1) + ROOM)
        anc = torch.cat([anc, torch.arange(rows, device=anc.device)[:, None]], 1)  # (R, t + 1)
        cross = [enc[f"shared_cross_{kv}{i}"] for i in range(len(self.layers)) for kv in "kv"]
        found = native.decoder_step(
            made,
            tokens.contiguous(),  # (a column of a batch's targets is strided)
            embed.tokens.weight,
            math.sqrt(embed.dim),
            embed.positions[t],
            buffers,
            t,
            cross,
            enc["cross_bias"],
            anc,
            enc["cross_slot"],
            norm,
            enc["src_mask"].size(1),
        )
        if found is None:
            return None
        new_state: State = {"self_anc": anc, "shared_end": end.fill_(t + 1)}
        for i in range(len(self.layers)):
            new_state[f"shared_k{i}"], new_state[f"shared_v{i}"] = buffers[2 * i], buffers[2 * i + 1]
        return found[0], new_state, found[1]

    def _shared(
        self, state: State, t: int, rows: int, room: int = ROOM
    ) -> tuple[torch.Tensor, list[torch.Tensor], torch.Tensor]:
        """For a step of `rows` rows at position t on the native kernels: the rows' ancestors (R, t) int64, the
        caches' buffers [k0, v0, k1, v1, ...] (slots >= rows, N, room > t, D) and "shared_end" (1,), the positions
        of those buffers written.

        Beam search reorders the state after every step, and copying every layer's cache to follow the beams was
        the largest memory traffic of a step. Instead the buffers are shared, never reordered (`reorder` passes
        "shared_" entries through): position j of slot s holds the keys that row s of step j wrote, and
        "self_anc" (R, t), which is reordered, says which slot holds each position of a row's history. A step
        writes row r's keys at position t of slot r. It does so in place when the buffers are this state's latest
        (shared_end == t: no other state has written position t), have room, and have a slot for every row;
        otherwise positions 0..t-1 are copied into new buffers first (anc stays valid: slots keep their index),
        with room for at least `room` positions (`_whole_step` asks for the source length plus ROOM: most outputs
        are about as long as their source, so a batch's buffers are rarely made again: 65-78 ms of a greedy search
        of test2016 on one thread went to making them, against 113-117 when they started at 16 positions).
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
        positions = buffers[0].size(2) if buffers[0].size(2) > t else max(t + max(ROOM, t // 2), room)
        grown = []
        for old in buffers:
            new = old.new_empty(slots, heads, positions, dim)
            new[: old.size(0), :, :t] = old[:, :, :t]
            grown.append(new)
        return anc, grown, torch.full((1,), t, dtype=torch.long, device=anc.device)

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
