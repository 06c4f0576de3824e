"""The Transformer against Vaswani et al. 2017 written out by hand.

Sinusoid values and a 2-dim, 2-position attention step are worked by hand; multi-head attention and a
whole 2-layer model (pre- and post-norm, scaled and unscaled) with fixed weights (tests/reference.py, no
RNG) are compared with plain tensor arithmetic from the equations, which never calls the model's modules
(nor F.scaled_dot_product_attention, nn.LayerNorm):
    Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V                      (eq. 1)
    MultiHead(Q, K, V) = Concat(head_1..head_N) W^O, head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)
    FFN(x) = max(0, x W_1 + b_1) W_2 + b_2                                  (eq. 2)
    PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d))   (sec. 3.5)
    embeddings multiplied by sqrt(d) (sec. 3.4); sub-layers LN(x + F(x)) (post) or x + F(LN(x)) (pre-norm).

Shape legend: B batch, S source length, T target length, H model dim, V vocab, N heads, D head dim, L layers.
"""

from __future__ import annotations

import math

import pytest
import torch

from nmt.config import ModelConfig
from nmt.data.tokenizer import BOS, PAD
from nmt.models.builders import build_model
from nmt.models.transformer import MultiHeadAttention, sinusoidal_positions
from tests.reference import fixed, set_params, softmax_over


# --- the sinusoidal encoding ----------------------------------------------------------------------
def test_sinusoid_values_worked_by_hand():
    """Fails if sin and cos were swapped, the exponent were i/d instead of 2i/d, or positions started at 1."""
    pe = sinusoidal_positions(3, 4)  # (positions 0..2, d = 4)
    # pos 0: sin(0) = 0, cos(0) = 1 in every pair
    torch.testing.assert_close(pe[0], torch.tensor([0.0, 1.0, 0.0, 1.0]))
    # pos 1, i = 0: sin(1 / 10000^0) = sin(1) = 0.841471, cos(1) = 0.540302
    # pos 1, i = 1: 10000^(2/4) = 100 -> sin(0.01) = 0.010000, cos(0.01) = 0.999950
    torch.testing.assert_close(pe[1], torch.tensor([0.841471, 0.540302, 0.010000, 0.999950]), atol=1e-6, rtol=0)
    # pos 2: sin(2) = 0.909297, cos(2) = -0.416147; sin(0.02) = 0.019999, cos(0.02) = 0.999800
    torch.testing.assert_close(pe[2], torch.tensor([0.909297, -0.416147, 0.019999, 0.999800]), atol=1e-6, rtol=0)


def positions_by_formula(length: int, dim: int, offset: int = 0) -> torch.Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d)), in Python floats."""
    table = [[0.0] * dim for _ in range(length)]
    for row, pos in enumerate(range(offset, offset + length)):
        for i in range(dim // 2):
            angle = pos / 10000 ** (2 * i / dim)
            table[row][2 * i], table[row][2 * i + 1] = math.sin(angle), math.cos(angle)
    return torch.tensor(table)


@pytest.mark.parametrize("offset", [0, 5])
def test_sinusoidal_table_follows_the_formula(offset):
    """Every entry of a d = 8 table, from `offset` on as `step` asks for it. Fails if the offset were ignored."""
    torch.testing.assert_close(
        sinusoidal_positions(6, 8, offset), positions_by_formula(6, 8, offset), atol=1e-5, rtol=0
    )


# --- multi-head attention -------------------------------------------------------------------------
def linear(P: dict, prefix: str, x: torch.Tensor, rows: slice = slice(None)) -> torch.Tensor:
    """x W^T + b with the given output rows of the layer `prefix`."""
    return x @ P[f"{prefix}.weight"][rows].T + P[f"{prefix}.bias"][rows]


def multi_head(P: dict, prefix: str, queries, keys, heads: int, allowed, scale: bool) -> dict[str, torch.Tensor]:
    """MultiHead(Q, K, V), head i reading rows i*D..(i+1)*D of W^Q, W^K, W^V (sec. 3.2.2).

    queries (B, T, H), keys = values (B, L, H), allowed broadcastable to (B, T, L) -> "out" (B, T, H),
    "weights" (B, N, T, L), and the projected "k", "v" (B, N, L, D).
    """
    H, at = queries.size(-1), f"{prefix}." if prefix else ""
    D = H // heads
    out = {"heads": [], "weights": [], "k": [], "v": []}
    for i in range(heads):
        rows = slice(i * D, (i + 1) * D)
        q, k, v = (linear(P, f"{at}{n}_proj", x, rows) for n, x in (("q", queries), ("k", keys), ("v", keys)))
        a = softmax_over(
            q @ k.transpose(1, 2) / (math.sqrt(D) if scale else 1.0), allowed
        )  # softmax(Q K^T / sqrt(d_k)) (B, T, L)
        for key, value in (("heads", a @ v), ("weights", a), ("k", k), ("v", v)):
            out[key].append(value)
    concat = torch.cat(out["heads"], -1)  # Concat(head_1..head_N) (B, T, H)
    return {
        "out": linear(P, f"{at}out_proj", concat),
        **{key: torch.stack(out[key], 1) for key in ("weights", "k", "v")},
    }


def attention_weights(dim: int, heads: int, scale: bool, seed: int = 0) -> tuple[MultiHeadAttention, dict]:
    attention = MultiHeadAttention(dim, heads, dropout=0.0, scale=scale).eval()
    P = {name: fixed(*p.shape, seed=seed + k) for k, (name, p) in enumerate(attention.named_parameters())}
    set_params(attention, P)
    return attention, P


@pytest.mark.parametrize("need_weights", [True, False])
def test_attention_step_worked_by_hand(need_weights):
    """One head, d = 2, two positions, identity W^Q, W^K, W^O and W^V = diag(2, 4).

    Fails if the scores were not divided by sqrt(d_k) (or were when model.scale=false), or if the fast
    path (F.scaled_dot_product_attention) and the path that returns weights disagreed.
    """
    for scale, expected_weights, expected_out in (
        # q = (1, 0), k_1 = (1, 0), k_2 = (0, 1): q.k = (1, 0), / sqrt(2) = (0.707107, 0)
        # softmax: e^0.707107 = 2.028115 -> (2.028115, 1) / 3.028115 = (0.669761, 0.330239)
        # values (2, 0), (0, 4): 0.669761 * (2, 0) + 0.330239 * (0, 4) = (1.339522, 1.320956)
        (True, [0.669761, 0.330239], [1.339522, 1.320956]),
        # unscaled: softmax(1, 0) = (e, 1) / (e + 1) = (0.731059, 0.268941) -> (1.462117, 1.075765)
        (False, [0.731059, 0.268941], [1.462117, 1.075765]),
    ):
        attention = MultiHeadAttention(2, 1, dropout=0.0, scale=scale).eval()
        eye, zero = torch.eye(2), torch.zeros(2)
        set_params(
            attention,
            {
                "q_proj.weight": eye,
                "k_proj.weight": eye,
                "v_proj.weight": torch.diag(torch.tensor([2.0, 4.0])),
                "out_proj.weight": eye,
                "q_proj.bias": zero,
                "k_proj.bias": zero,
                "v_proj.bias": zero,
                "out_proj.bias": zero,
            },
        )
        with torch.no_grad():
            out, weights = attention.attend(
                torch.tensor([[[1.0, 0.0]]]), *attention.keys_values(torch.eye(2)[None]), need_weights=need_weights
            )
        torch.testing.assert_close(out, torch.tensor([[expected_out]]), atol=1e-5, rtol=0)
        if need_weights:
            torch.testing.assert_close(weights, torch.tensor([[[expected_weights]]]), atol=1e-6, rtol=0)


@pytest.mark.parametrize("need_weights", [True, False])
@pytest.mark.parametrize("scale", [True, False])
def test_multi_head_attention_follows_eq_1(scale, need_weights):
    """H = 6, N = 3 heads of D = 2, a padded key. Fails if the heads were split across the wrong axis,
    scaled by sqrt(H) instead of sqrt(D), concatenated in another order, or attended to padding."""
    attention, P = attention_weights(6, 3, scale)
    queries, keys = fixed(2, 3, 6, seed=100, scale=1.5), fixed(2, 4, 6, seed=200, scale=1.5)  # (B, T, H), (B, L, H)
    mask = torch.tensor([[True, True, True, True], [True, True, True, False]])[:, None, None, :]  # (B, 1, 1, L)
    ref = multi_head(P, "", queries, keys, 3, mask[:, 0], scale)
    with torch.no_grad():
        k, v = attention.keys_values(keys)
        out, weights = attention.attend(queries, k, v, mask=mask, need_weights=need_weights)
    torch.testing.assert_close(k, ref["k"], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(v, ref["v"], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out, ref["out"], atol=1e-5, rtol=1e-5)
    if need_weights:
        torch.testing.assert_close(weights, ref["weights"], atol=1e-6, rtol=1e-5)


# --- the whole model ------------------------------------------------------------------------------
V, DIM, HEADS, LAYERS = 7, 4, 2, 2


def layer_norm(P: dict, prefix: str, x: torch.Tensor) -> torch.Tensor:
    """g (x - mean) / sqrt(var + 1e-5) + b over the last dim (Ba et al. 2016)."""
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return P[f"{prefix}.weight"] * (x - mean) / torch.sqrt(var + 1e-5) + P[f"{prefix}.bias"]


def transformer_reference(P: dict, norm: str, scale: bool, src, src_mask, tgt_in) -> dict[str, torch.Tensor]:
    """Vaswani et al. 2017, sec. 3 (pre-norm: Wang et al. 2019): "memory" (B, S, H), "logits" (B, T, V),
    cross-attention "maps" (B, L, N, T, S), and each decoder layer's self-attention keys/values (B, N, T, D)."""

    def sublayer(x, f, ln):
        return x + f(layer_norm(P, ln, x)) if norm == "pre" else layer_norm(P, ln, x + f(x))

    def ffn(prefix, x):
        return linear(P, f"{prefix}.3", torch.relu(linear(P, f"{prefix}.0", x)))  # max(0, x W_1 + b_1) W_2 + b_2

    def embed(side, tokens):
        return P[f"{side}.embed.tokens.weight"][tokens] * math.sqrt(DIM) + positions_by_formula(tokens.size(1), DIM)

    x = embed("encoder", src)
    for layer in range(LAYERS):
        at = f"encoder.layers.{layer}"
        x = sublayer(
            x,
            lambda h, at=at: multi_head(P, f"{at}.attn", h, h, HEADS, src_mask[:, None, :], scale)["out"],
            f"{at}.res_attn.norm",
        )
        x = sublayer(x, lambda h, at=at: ffn(f"{at}.ffn", h), f"{at}.res_ffn.norm")
    memory = layer_norm(P, "encoder.final_norm", x) if norm == "pre" else x
    y, T = embed("decoder", tgt_in), tgt_in.size(1)
    causal = torch.ones(T, T, dtype=torch.bool).tril()[None]  # position t sees 0..t (1, T, T)
    out: dict[str, list] = {"maps": [], "self_k": [], "self_v": []}
    for layer in range(LAYERS):
        at = f"decoder.layers.{layer}"
        seen: dict[str, dict] = {}

        def attend(h, name, keys, allowed, at=at, seen=seen):
            seen[name] = multi_head(P, f"{at}.{name}", h, h if keys is None else keys, HEADS, allowed, scale)
            return seen[name]["out"]

        y = sublayer(y, lambda h: attend(h, "self_attn", None, causal), f"{at}.res_self.norm")
        y = sublayer(y, lambda h: attend(h, "cross_attn", memory, src_mask[:, None, :]), f"{at}.res_cross.norm")
        y = sublayer(y, lambda h, at=at: ffn(f"{at}.ffn", h), f"{at}.res_ffn.norm")
        out["maps"].append(seen["cross_attn"]["weights"])
        out["self_k"].append(seen["self_attn"]["k"])
        out["self_v"].append(seen["self_attn"]["v"])
    y = layer_norm(P, "decoder.final_norm", y) if norm == "pre" else y
    return {
        "memory": memory,
        "logits": y @ P["decoder.output.weight"].T,
        "maps": torch.stack(out["maps"], 1),
        "self_k": out["self_k"],
        "self_v": out["self_v"],
    }


@pytest.mark.parametrize("scale", [True, False])
@pytest.mark.parametrize("norm", ["pre", "post"])
def test_transformer_follows_the_paper(norm, scale):
    """Logits, cross-attention maps and key/value caches, teacher-forced and step by step.

    Fails if the embeddings were not scaled by sqrt(d), the positions were added wrongly, a sub-layer's
    norm or residual were misplaced, the decoder saw a later position, cross-attention read the queries'
    own layer instead of the encoder's output or attended to padding, or a cache held the wrong keys.
    """
    cfg = ModelConfig(
        dim=DIM, layers=LAYERS, heads=HEADS, ffn_dim=6, dropout=0.0, norm=norm, scale=scale, tie_embeddings=False
    )
    model = build_model(cfg, V, V, joint=False).eval()
    P = {}
    for k, (name, p) in enumerate(model.named_parameters()):
        P[name] = fixed(*p.shape, seed=k) * (0.3 if "norm" in name else 1.0) + (
            1.0 if name.endswith("norm.weight") else 0.0
        )
    set_params(model, P)
    src = torch.tensor([[4, 5, 6, 3], [6, 3, PAD, PAD]])
    tgt_in = torch.tensor([[BOS, 4, 6], [BOS, 5, PAD]])
    ref = transformer_reference(P, norm, scale, src, src != PAD, tgt_in)
    with torch.no_grad():
        enc = model.encode(src, src != PAD)
        torch.testing.assert_close(enc["memory"], ref["memory"], atol=1e-5, rtol=1e-5)
        logits, attn = model.decoder(tgt_in, enc, need_attn=True)
        torch.testing.assert_close(logits, ref["logits"], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(
            attn, ref["maps"][:, -1].mean(1), atol=1e-6, rtol=1e-5
        )  # plotted: last layer, mean over heads
        torch.testing.assert_close(model.decoder.attention_maps(tgt_in, enc), ref["maps"], atol=1e-6, rtol=1e-5)
        state = model.init_state(enc)
        for t in range(tgt_in.size(1)):
            logits, state, attn = model.step(tgt_in[:, t], enc, state)
            torch.testing.assert_close(logits, ref["logits"][:, t], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(attn, ref["maps"][:, -1, :, t].mean(1), atol=1e-6, rtol=1e-5)
            for layer in range(LAYERS):
                torch.testing.assert_close(
                    state[f"self_k{layer}"], ref["self_k"][layer][:, :, : t + 1], atol=1e-5, rtol=1e-5
                )
                torch.testing.assert_close(
                    state[f"self_v{layer}"], ref["self_v"][layer][:, :, : t + 1], atol=1e-5, rtol=1e-5
                )
