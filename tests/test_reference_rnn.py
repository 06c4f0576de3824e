"""The RNN encoder-decoders against references written from the papers' equations.

`step` against teacher forcing cannot catch a wrong equation in these decoders (both loop over the same
`advance`). Here each decoder runs with fixed weights (tests/reference.py, no RNG) on a hand-made encoder
output, and its logits, attention weights and states are compared, step by step and teacher-forced,
with plain tensor arithmetic written from the equations: the GRU of Cho et al. 2014 as Bahdanau et al.
2014 write it (appendix A.1.1), the LSTM of Zaremba et al. 2014 that Luong et al. 2015 use, Bahdanau's
attention and maxout readout (appendix A.2.2), Luong's scores, windows and input feeding (sec. 3).
The references never call nn.GRU, nn.LSTM or the attention zoo. The first two tests work one step of
each decoder by hand on 1-dim states.

Shape legend: B batch, S source length, T target length, E embedding, H hidden, V vocab.
"""

from __future__ import annotations

import math

import pytest
import torch

from nmt.config import ModelConfig
from nmt.data.tokenizer import BOS, PAD
from nmt.models.builders import build_model
from tests.reference import fixed, set_params, sigmoid, softmax_over

V, H = 6, 2
MEMORY = fixed(2, 4, H, seed=1, scale=1.5)  # (B, S, H) the encoder states h_j / h_s
MEMORY[1, 2:] = 5.0  # padding: large values that would show if the mask were ignored
MASK = torch.tensor([[True, True, True, True], [True, True, False, False]])  # true lengths 4 and 2
TOKENS = torch.tensor([[BOS, 4, 5, 1], [BOS, 5, 3, PAD]])  # (B, T) y_0 .. y_3 fed to the decoder
S0, C0 = fixed(2, H, seed=2), fixed(2, H, seed=3)  # initial decoder state (and LSTM cell)


# --- the recurrent cells, from their equations --------------------------------------------------
def gru_weights(input_dim: int, dim: int, seed: int) -> dict[str, torch.Tensor]:
    """W_z, U_z, W_r, U_r, W, U of the GRU (no biases, as in the paper); U diagonal, see load_gru."""
    w = {name: fixed(dim, input_dim, seed=seed + k) for k, name in enumerate(("W_z", "W_r", "W"))}
    u = {name: fixed(dim, dim, seed=seed + 3 + k) for k, name in enumerate(("U_z", "U_r"))}
    return w | u | {"U": torch.diag(fixed(dim, seed=seed + 5) + 0.5)}


def gru(x: torch.Tensor, s: torch.Tensor, P: dict) -> torch.Tensor:
    """Bahdanau et al. 2014, appendix A.1.1 (Cho et al. 2014): x (B, I), s_{i-1} (B, H) -> s_i (B, H).

    z = sigma(W_z x + U_z s), r = sigma(W_r x + U_r s), s~ = tanh(W x + U [r o s]), s_i = (1 - z) o s + z o s~.
    """
    z = sigmoid(x @ P["W_z"].T + s @ P["U_z"].T)
    r = sigmoid(x @ P["W_r"].T + s @ P["U_r"].T)
    proposal = torch.tanh(x @ P["W"].T + (r * s) @ P["U"].T)
    return (1 - z) * s + z * proposal


def gru_params(prefix: str, P: dict, suffix: str = "_l0") -> dict[str, torch.Tensor]:
    """The paper's GRU as nn.GRU's parameters.

    nn.GRU computes r, z' = sigma(...), n = tanh(W_in x + r o (W_hn h)), h' = (1 - z') o n + z' o h: its z'
    is the paper's 1 - z, so it takes -W_z, -U_z (sigma(-a) = 1 - sigma(a)); and r o (U h) = U (r o h)
    because U is diagonal. Biases zero.
    """
    dim = P["U"].size(0)
    return {
        f"{prefix}.weight_ih{suffix}": torch.cat([P["W_r"], -P["W_z"], P["W"]]),
        f"{prefix}.weight_hh{suffix}": torch.cat([P["U_r"], -P["U_z"], P["U"]]),
        f"{prefix}.bias_ih{suffix}": torch.zeros(3 * dim),
        f"{prefix}.bias_hh{suffix}": torch.zeros(3 * dim),
    }


def lstm_weights(input_dim: int, dim: int, seed: int) -> dict[str, torch.Tensor]:
    """W_i, U_i, W_f, U_f, W_o, U_o, W_g, U_g of the LSTM (no biases)."""
    out = {}
    for k, gate in enumerate("ifog"):
        out[f"W_{gate}"] = fixed(dim, input_dim, seed=seed + 2 * k)
        out[f"U_{gate}"] = fixed(dim, dim, seed=seed + 2 * k + 1)
    return out


def lstm(x: torch.Tensor, h: torch.Tensor, c: torch.Tensor, P: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """Zaremba et al. 2014, the cell of Luong et al. 2015: (i, f, o) = sigma(W x + U h), g = tanh(W_g x + U_g h),
    c' = f o c + i o g, h' = o o tanh(c')."""
    i, f, o = (sigmoid(x @ P[f"W_{k}"].T + h @ P[f"U_{k}"].T) for k in "ifo")
    g = torch.tanh(x @ P["W_g"].T + h @ P["U_g"].T)
    c = f * c + i * g
    return o * torch.tanh(c), c


def lstm_params(prefix: str, P: dict, suffix: str = "_l0") -> dict[str, torch.Tensor]:
    """The LSTM as nn.LSTM's parameters: gates stacked in the order i, f, g, o; biases zero."""
    dim = P["U_i"].size(0)
    return {
        f"{prefix}.weight_ih{suffix}": torch.cat([P[f"W_{k}"] for k in "ifgo"]),
        f"{prefix}.weight_hh{suffix}": torch.cat([P[f"U_{k}"] for k in "ifgo"]),
        f"{prefix}.bias_ih{suffix}": torch.zeros(4 * dim),
        f"{prefix}.bias_hh{suffix}": torch.zeros(4 * dim),
    }


def cell_weights(cell: str, input_dim: int, dim: int, seed: int) -> dict[str, torch.Tensor]:
    return (gru_weights if cell == "gru" else lstm_weights)(input_dim, dim, seed)


def cell_params(cell: str, prefix: str, P: dict, suffix: str = "_l0") -> dict[str, torch.Tensor]:
    return (gru_params if cell == "gru" else lstm_params)(prefix, P, suffix)


def cell_step(
    cell: str, x: torch.Tensor, h: torch.Tensor, c: torch.Tensor | None, P: dict
) -> tuple[torch.Tensor, torch.Tensor | None]:
    return (gru(x, h, P), None) if cell == "gru" else lstm(x, h, c, P)


# --- running a decoder ----------------------------------------------------------------------------
def decoder(**overrides) -> torch.nn.Module:
    """A 1-layer decoder without dropout and with its own output matrix (the encoder is not used)."""
    # the papers' equations read E y as stored: the readout scale (model.embed_scale) is checked on its own below
    cfg = ModelConfig(
        **(
            {
                "dim": H,
                "layers": 1,
                "dropout": 0.0,
                "bidirectional": False,
                "tie_embeddings": False,
                "embed_scale": False,
            }
            | overrides
        )
    )
    return build_model(cfg, V, V, joint=False).decoder.eval()


def encoder_output(cell: str, memory=MEMORY, mask=MASK, s0=S0, c0=C0) -> dict[str, torch.Tensor]:
    enc = {"memory": memory, "src_mask": mask, "init_h": s0[:, None]}  # (B, L=1, H)
    if cell == "lstm":
        enc["init_c"] = c0[:, None]
    return enc


def assert_matches(dec, enc: dict, tokens: torch.Tensor, ref: dict[str, torch.Tensor]) -> None:
    """Teacher forcing and `step` both give the reference's logits (B, T, V) and attention (B, T, S), and
    after step t the state holds the reference's states ref[key][:, t] (B, H) ("h", "c", "feed")."""
    enc = dec.prepare(enc)  # the attention keys, computed once per sentence as the search does
    with torch.no_grad():
        logits, attn = dec(tokens, enc, need_attn=True)
        torch.testing.assert_close(logits, ref["logits"], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(attn, ref["attn"], atol=1e-5, rtol=1e-5)
        state = dec.init_state(enc)
        for t in range(tokens.size(1)):
            logits, state, attn = dec.step(tokens[:, t], enc, state)
            torch.testing.assert_close(logits, ref["logits"][:, t], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(attn, ref["attn"][:, t], atol=1e-5, rtol=1e-5)
            for key in ("h", "c", "feed"):
                if key in ref:
                    value = state[key][:, -1] if key != "feed" else state[key]  # "h", "c": top layer of (B, L, H)
                    torch.testing.assert_close(
                        value, ref[key][:, t], atol=1e-5, rtol=1e-5, msg=f"state {key!r} after step {t}"
                    )


# --- Bahdanau et al. 2014 -------------------------------------------------------------------------
def bahdanau_weights(cell: str, E: int) -> dict:
    P = {
        "E": fixed(V, E, seed=10),
        "W_a": fixed(H, H, seed=11),
        "U_a": fixed(H, H, seed=12),
        "v_a": fixed(H, seed=13),
        "U_o": fixed(2 * E, H, seed=14),
        "V_o": fixed(2 * E, E, seed=15),
        "C_o": fixed(2 * E, H, seed=16),
        "W_o": fixed(V, E, seed=17),
        "rnn": cell_weights(cell, E + H, H, seed=20),  # input [E y_{i-1}; c_i]: the paper's W and C side by side
    }
    P["E"][PAD] = 0.0
    return P


def bahdanau_params(cell: str, P: dict) -> dict[str, torch.Tensor]:
    """The decoder's parameters; the readout is one matrix over [s_{i-1}; E y_{i-1}; c_i], i.e. [U_o V_o C_o]."""
    return {
        "embed.weight": P["E"],
        "attention.W_a.weight": P["W_a"],
        "attention.U_a.weight": P["U_a"],
        "attention.U_a.bias": torch.zeros(H),
        "attention.v_a.weight": P["v_a"][None],
        "readout.weight": torch.cat([P["U_o"], P["V_o"], P["C_o"]], 1),
        "readout.bias": torch.zeros(P["U_o"].size(0)),
        "output.weight": P["W_o"],
    } | cell_params(cell, "rnn.rnn", P["rnn"])


def bahdanau_reference(P: dict, cell: str, memory, mask, s0, c0, tokens) -> dict[str, torch.Tensor]:
    """Bahdanau et al. 2014, eq. 4-6 and appendix A.2.2, one target position i at a time."""
    s, c = s0, c0
    out: dict[str, list] = {"logits": [], "attn": [], "h": [], "c": []}
    for i in range(tokens.size(1)):
        y = P["E"][tokens[:, i]]  # E y_{i-1} (B, E)
        e = (
            torch.tanh((s @ P["W_a"].T)[:, None, :] + memory @ P["U_a"].T) @ P["v_a"]
        )  # e_ij = v_a^T tanh(W_a s_{i-1} + U_a h_j) (B, S)
        a = softmax_over(e, mask)  # a_ij over the real positions j
        context = (a[:, :, None] * memory).sum(1)  # c_i = sum_j a_ij h_j (B, H)
        t_tilde = (
            s @ P["U_o"].T + y @ P["V_o"].T + context @ P["C_o"].T
        )  # t~_i = U_o s_{i-1} + V_o E y_{i-1} + C_o c_i (B, 2E)
        t = torch.maximum(t_tilde[:, 0::2], t_tilde[:, 1::2])  # t_i,k = max(t~_i,2k-1, t~_i,2k) (B, E)
        out["logits"].append(t @ P["W_o"].T)  # p(y_i | ...) = softmax(W_o t_i)
        out["attn"].append(a)
        s, c = cell_step(cell, torch.cat([y, context], -1), s, c, P["rnn"])  # s_i = f(s_{i-1}, y_{i-1}, c_i)
        out["h"].append(s)
        out["c"].append(c)
    if c is None:
        del out["c"]
    return {key: torch.stack(values, 1) for key, values in out.items()}


@pytest.mark.parametrize("cell, E", [("gru", 2), ("lstm", 3)])
def test_bahdanau_decoder_follows_the_paper(cell, E):
    """Fails if the score used s_i instead of s_{i-1}, the maxout took halves instead of pairs, the readout
    left out s_{i-1}, E y_{i-1} or c_i, the RNN were fed y_{i-1} without c_i, or padding got weight."""
    dec = decoder(arch="bahdanau", cell=cell, score="additive", embed_dim=E)
    P = bahdanau_weights(cell, E)
    set_params(dec, bahdanau_params(cell, P))
    ref = bahdanau_reference(P, cell, MEMORY, MASK, S0, C0 if cell == "lstm" else None, TOKENS)
    assert_matches(dec, encoder_output(cell), TOKENS, ref)


def test_bahdanau_first_step_worked_by_hand():
    """One step on 1-dim states: attention with s_0, the maxout readout, then s_1.

    Fails if the score used s_1 instead of s_0, the softmax or the maxout were wrong, or C_o c_1 were left out.
    """
    dec = decoder(arch="bahdanau", cell="gru", score="additive", dim=1, embed_dim=1)
    half_ln3 = 0.5 * math.log(3)  # tanh(ln(3) / 2) = (3 - 1) / (3 + 1) = 0.5
    set_params(
        dec,
        {
            "embed.weight": torch.tensor([[0.0], [0.0], [0.5], [0.0], [0.0], [0.0]]),  # E y_0 = E[BOS] = 0.5
            "attention.W_a.weight": torch.tensor([[1.0]]),
            "attention.U_a.weight": torch.tensor([[1.0]]),
            "attention.U_a.bias": torch.tensor([0.0]),
            "attention.v_a.weight": torch.tensor([[4 * half_ln3]]),
            "readout.weight": torch.tensor([[1.0, 0.0, 0.0], [0.0, 2.0, -1.0]]),
            "readout.bias": torch.zeros(2),  # rows of [U_o V_o C_o]
            "output.weight": torch.tensor([[0.0], [1.0], [-1.0], [2.0], [0.0], [0.0]]),
            "rnn.rnn.weight_ih_l0": torch.full((3, 2), 0.5),
            "rnn.rnn.weight_hh_l0": torch.full((3, 1), 0.5),
            "rnn.rnn.bias_ih_l0": torch.zeros(3),
            "rnn.rnn.bias_hh_l0": torch.zeros(3),
        },
    )
    enc = dec.prepare(
        encoder_output(
            "gru",
            memory=torch.tensor([[[-1.0], [-1.0 + half_ln3]]]),
            mask=torch.tensor([[True, True]]),
            s0=torch.tensor([[1.0]]),
        )
    )
    with torch.no_grad():
        logits, state, attn = dec.step(torch.tensor([BOS]), enc, dec.init_state(enc))
    # e_0 = v_a tanh(W_a s_0 + U_a h_0) = 2 ln 3 * tanh(1 - 1) = 0
    # e_1 = 2 ln 3 * tanh(1 - 1 + ln(3)/2) = 2 ln 3 * 0.5 = ln 3
    # a = (e^0, e^ln3) / (1 + 3) = (0.25, 0.75)
    torch.testing.assert_close(attn, torch.tensor([[0.25, 0.75]]))
    # c_1 = 0.25 * (-1) + 0.75 * (-1 + 0.549306) = -0.25 - 0.338021 = -0.588021
    # t~_1 = (U_o s_0, V_o E y_0 + C_o c_1) = (1 * 1, 2 * 0.5 - 1 * (-0.588021)) = (1, 1.588021); t_1 = max = 1.588021
    # logits = W_o t_1 = (0, 1.588021, -1.588021, 3.176042, 0, 0)
    torch.testing.assert_close(
        logits, torch.tensor([[0.0, 1.588021, -1.588021, 3.176042, 0.0, 0.0]]), atol=1e-5, rtol=0
    )
    # s_1 from nn.GRU's own equations with every weight 0.5, x = [E y_0; c_1] = (0.5, -0.588021), h = s_0 = 1:
    # r = z = sigma(0.5 * 0.5 + 0.5 * (-0.588021) + 0.5 * 1) = sigma(0.455990) = 0.612062
    # n = tanh(0.5 * 0.5 + 0.5 * (-0.588021) + r * 0.5 * 1) = tanh(-0.044010 + 0.306031) = tanh(0.262021) = 0.256184
    # s_1 = (1 - z) n + z s_0 = 0.387938 * 0.256184 + 0.612062 = 0.711445
    torch.testing.assert_close(state["h"], torch.tensor([[[0.711445]]]), atol=1e-5, rtol=0)


# --- Luong et al. 2015 ----------------------------------------------------------------------------
LUONG = {  # name -> (cell, score, window, input feeding, attention kind); D = 1 for the local windows
    "dot": ("lstm", "dot", "global", True, "soft"),
    "general": ("lstm", "general", "global", True, "soft"),
    "concat": ("lstm", "concat", "global", True, "soft"),
    "location": ("lstm", "location", "global", True, "soft"),
    "gru_no_feeding": ("gru", "general", "global", False, "soft"),
    "local_m": ("lstm", "general", "local_m", True, "soft"),
    "local_p": ("lstm", "general", "local_p", True, "soft"),
    "local_p_dot_no_feeding": ("lstm", "dot", "local_p", False, "soft"),
    "hard": ("lstm", "general", "global", True, "hard"),
}
D = 1


def luong_weights(cell: str, feeding: bool) -> dict:
    P = {
        "E": fixed(V, H, seed=30),
        "W_c": fixed(H, 2 * H, seed=31),
        "W_s": fixed(V, H, seed=32),
        "W_a_general": fixed(H, H, seed=33),
        "W_a_concat": fixed(H, 2 * H, seed=34),
        "v_a": fixed(H, seed=35),
        "W_a_location": fixed(4, H, seed=36, scale=2.0),
        "W_p": fixed(H, H, seed=37, scale=2.0),
        "v_p": fixed(H, seed=38, scale=2.0),
        "rnn": cell_weights(
            cell, 2 * H if feeding else H, H, seed=40
        ),  # input [E y_{t-1}; h~_{t-1}] with input feeding
    }
    P["E"][PAD] = 0.0
    return P


def luong_params(cell: str, score: str, window: str, kind: str, P: dict) -> dict[str, torch.Tensor]:
    """The decoder's parameters; the scorer sits inside a LocalWindow (.scorer) and/or a HardAttention (.inner)."""
    at = "attention.inner" if kind == "hard" else "attention"
    scorer = f"{at}.scorer" if window != "global" else at
    params = {"embed.weight": P["E"], "W_c.weight": P["W_c"], "output.weight": P["W_s"]} | cell_params(
        cell, "rnn.rnn", P["rnn"]
    )
    params |= {
        "dot": {},
        "general": {f"{scorer}.W_a.weight": P["W_a_general"]},
        "concat": {f"{scorer}.W_a.weight": P["W_a_concat"], f"{scorer}.v_a.weight": P["v_a"][None]},
        "location": {f"{scorer}.W_a.weight": P["W_a_location"], f"{scorer}.W_a.bias": torch.zeros(4)},
    }[score]
    if window == "local_p":
        params |= {f"{at}.W_p.weight": P["W_p"], f"{at}.v_p.weight": P["v_p"][None]}
    return params


def luong_score(P: dict, score: str, h: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
    """Luong et al. 2015, eq. 8 and sec. 3.1: h_t (B, H), h_s (B, S, H) -> score (B, S)."""
    if score == "dot":
        return (memory * h[:, None, :]).sum(-1)  # h_t^T h_s
    if score == "general":
        return (memory @ P["W_a_general"].T * h[:, None, :]).sum(-1)  # h_t^T W_a h_s
    if score == "concat":
        both = torch.cat([h[:, None, :].expand_as(memory), memory], -1)  # [h_t; h_s] (B, S, 2H)
        return torch.tanh(both @ P["W_a_concat"].T) @ P["v_a"]  # v_a^T tanh(W_a [h_t; h_s])
    return (h @ P["W_a_location"].T)[:, : memory.size(1)]  # location: a_t = softmax(W_a h_t)


def luong_reference(
    P: dict, cell: str, score: str, window: str, feeding: bool, kind: str, memory, mask, s0, c0, tokens
) -> dict[str, torch.Tensor]:
    """Luong et al. 2015, sec. 3: h_t = RNN(h_{t-1}, [E y_{t-1}; h~_{t-1}]), a_t = align(h_t, h_s) in a window,
    c_t = sum_s a_t(s) h_s, h~_t = tanh(W_c [c_t; h_t]) (eq. 5), logits W_s h~_t (eq. 6)."""
    B, S = mask.shape
    length = mask.sum(1, keepdim=True).float()  # S_b, the true source lengths (B, 1)
    source = torch.arange(S, dtype=torch.float32)[None, :]  # s (1, S)
    h, c, feed = s0, c0, torch.zeros(B, H)  # h~_0 = 0
    out: dict[str, list] = {"logits": [], "attn": [], "h": [], "c": [], "feed": []}
    for t in range(tokens.size(1)):
        y = P["E"][tokens[:, t]]  # E y_{t-1} (B, E)
        h, c = cell_step(cell, torch.cat([y, feed], -1) if feeding else y, h, c, P["rnn"])  # input feeding, sec. 3.3
        allowed = mask
        if window == "local_m":
            p = torch.minimum(torch.full((B, 1), float(t)), length - 1)  # p_t = t (at most the last real position)
        elif window == "local_p":
            p = (
                length * sigmoid(torch.tanh(h @ P["W_p"].T) @ P["v_p"])[:, None]
            )  # eq. 9: p_t = S_b sigmoid(v_p^T tanh(W_p h_t))
        if window != "global":
            allowed = mask & ((source - p).abs() <= D)  # the window [p_t - D, p_t + D]
        a = softmax_over(luong_score(P, score, h, memory), allowed)  # eq. 7
        if window == "local_p":
            a = a * torch.exp(-((source - p) ** 2) / (2 * (D / 2) ** 2))  # eq. 10, sigma = D / 2
        if kind == "hard":
            a = torch.nn.functional.one_hot(a.argmax(-1), S).float()  # at inference: the most probable position
        context = (a[:, :, None] * memory).sum(1)  # c_t (B, H)
        feed = torch.tanh(torch.cat([context, h], -1) @ P["W_c"].T)  # h~_t = tanh(W_c [c_t; h_t]) (B, H)
        for key, value in (("logits", feed @ P["W_s"].T), ("attn", a), ("h", h), ("c", c), ("feed", feed)):
            out[key].append(value)
    if c is None:
        del out["c"]
    if not feeding:
        del out["feed"]
    return {key: torch.stack(values, 1) for key, values in out.items()}


@pytest.mark.parametrize("name", LUONG)
def test_luong_decoder_follows_the_paper(name):
    """Fails if h~_t were not tanh(W_c [c_t; h_t]) (order, tanh), h~_{t-1} were not fed to the next input,
    the query were h_{t-1} instead of h_t, a score differed from eq. 8, local-m/-p windows or p_t (eq. 9),
    the Gaussian (eq. 10) or hard attention's argmax were wrong, or padding got weight."""
    cell, score, window, feeding, kind = LUONG[name]
    dec = decoder(
        arch="luong",
        cell=cell,
        score=score,
        window=window,
        window_size=D,
        input_feeding=feeding,
        attention=kind,
        max_src_len=4,
    )
    P = luong_weights(cell, feeding)
    set_params(dec, luong_params(cell, score, window, kind, P))
    ref = luong_reference(
        P, cell, score, window, feeding, kind, MEMORY, MASK, S0, C0 if cell == "lstm" else None, TOKENS
    )
    if window == "local_p":
        assert not torch.allclose(ref["attn"].sum(-1), torch.ones(2, 4))  # the Gaussian is really at work
    assert_matches(dec, encoder_output(cell), TOKENS, ref)


def test_luong_first_step_worked_by_hand():
    """One step on 1-dim states: h_1 from the LSTM, dot attention with h_1, h~_1 = tanh(W_c [c_1; h_1]).

    Fails if the query were h_0 instead of h_1, W_c read [h_1; c_1], the tanh were left out,
    or h~_1 were not kept to feed.
    """
    dec = decoder(arch="luong", cell="lstm", score="dot", dim=1, embed_dim=1)
    set_params(
        dec,
        {
            "embed.weight": torch.ones(V, 1),
            "W_c.weight": torch.tensor([[0.5, -1.0]]),
            "output.weight": torch.tensor([[0.0], [1.0], [2.0], [-1.0], [0.0], [0.0]]),
            "rnn.rnn.weight_ih_l0": torch.zeros(4, 2),
            "rnn.rnn.weight_hh_l0": torch.zeros(4, 1),
            "rnn.rnn.bias_ih_l0": torch.zeros(4),
            "rnn.rnn.bias_hh_l0": torch.zeros(4),
        },
    )
    ln3 = math.log(3)
    enc = dec.prepare(
        encoder_output(
            "lstm",
            memory=torch.tensor([[[0.0], [2.5 * ln3]]]),
            mask=torch.tensor([[True, True]]),
            s0=torch.tensor([[3.0]]),
            c0=torch.tensor([[2 * ln3]]),
        )
    )
    with torch.no_grad():
        logits, state, attn = dec.step(torch.tensor([BOS]), enc, dec.init_state(enc))
    # all LSTM weights 0: i = f = o = sigma(0) = 0.5, g = tanh(0) = 0
    # c_1 = f c_0 + i g = 0.5 * 2 ln 3 = ln 3;  h_1 = o tanh(c_1) = 0.5 * (9 - 1) / (9 + 1) = 0.4
    # (tanh(ln 3) = (3^2 - 1) / (3^2 + 1))
    torch.testing.assert_close(state["c"], torch.tensor([[[ln3]]]))
    torch.testing.assert_close(state["h"], torch.tensor([[[0.4]]]))
    # scores h_1 h_s = (0.4 * 0, 0.4 * 2.5 ln 3) = (0, ln 3) -> a = (1, 3) / 4 = (0.25, 0.75)
    torch.testing.assert_close(attn, torch.tensor([[0.25, 0.75]]))
    # c = 0.75 * 2.5 ln 3 = 2.059898;  h~_1 = tanh(0.5 * 2.059898 - 1 * 0.4) = tanh(0.629949) = 0.558017
    torch.testing.assert_close(state["feed"], torch.tensor([[0.558017]]), atol=1e-5, rtol=0)
    # logits = W_s h~_1 = (0, 0.558017, 1.116034, -0.558017, 0, 0)
    torch.testing.assert_close(
        logits, torch.tensor([[0.0, 0.558017, 1.116034, -0.558017, 0.0, 0.0]]), atol=1e-5, rtol=0
    )


# --- the encoder ----------------------------------------------------------------------------------
def encoder_reference(
    P: dict, cell: str, bidirectional: bool, bridge: bool, src: torch.Tensor, mask: torch.Tensor
) -> dict[str, torch.Tensor]:
    """Bahdanau et al. 2014, sec. 3.2: h_j = [h->_j; h<-_j], each direction read over the true length only;
    the initial decoder state tanh(W_b [h->_last; h<-_first] + b_b) (and the same for an LSTM's cell), or zeros."""
    x = P["E"][src]  # (B, S, E)
    B, S, _ = x.shape
    dim = P["fwd"]["U_z" if cell == "gru" else "U_i"].size(0)  # units per direction
    memory, finals_h, finals_c = torch.zeros(B, S, dim * (2 if bidirectional else 1)), [], []
    for b in range(B):
        n = int(mask[b].sum())
        hs, cs = [], []
        for direction, order in (("fwd", range(n)), ("bwd", reversed(range(n))))[: 2 if bidirectional else 1]:
            h, c = torch.zeros(1, dim), torch.zeros(1, dim)
            for j in order:
                h, c = cell_step(cell, x[b, j][None], h, c, P[direction])
                memory[b, j, (0 if direction == "fwd" else dim) : (dim if direction == "fwd" else 2 * dim)] = h[0]
            hs.append(h[0])
            cs.append(c[0] if c is not None else None)
        finals_h.append(torch.cat(hs))
        finals_c.append(torch.cat(cs) if cell == "lstm" else None)
    enc = {"memory": memory}
    for key, finals, W in (("init_h", finals_h, "W_b"), ("init_c", finals_c, "W_bc")):
        if key == "init_c" and cell == "gru":
            continue
        final = torch.stack(finals)  # (B, H)
        enc[key] = (torch.tanh(final @ P[W].T + P["b_" + W]) if bridge else torch.zeros_like(final))[
            :, None
        ]  # (B, L=1, H)
    return enc


@pytest.mark.parametrize(
    "cell, bidirectional, bridge",
    [("gru", True, True), ("lstm", True, True), ("lstm", False, True), ("gru", True, False)],
)
def test_encoder_reads_each_sentence_both_ways_and_bridges_its_final_states(cell, bidirectional, bridge):
    """Fails if the backward direction started on padding (no packing), the directions' halves were swapped,
    the bridge read the wrong final states (e.g. the forward state at a padded position), or lacked its tanh."""
    dim, E = 4, 3
    per = dim // (2 if bidirectional else 1)
    P = {
        "E": fixed(V, E, seed=50),
        "W_b": fixed(dim, dim, seed=51),
        "b_W_b": fixed(dim, seed=52),
        "W_bc": fixed(dim, dim, seed=53),
        "b_W_bc": fixed(dim, seed=54),
    }
    P["fwd"], P["bwd"] = cell_weights(cell, E, per, seed=60), cell_weights(cell, E, per, seed=70)
    cfg = ModelConfig(
        arch="luong",
        cell=cell,
        dim=dim,
        embed_dim=E,
        layers=1,
        dropout=0.0,
        bidirectional=bidirectional,
        bridge="bridge" if bridge else "zero",
        embed_scale=False,
        tie_embeddings=False,
    )
    encoder = build_model(cfg, V, V, joint=False).encoder.eval()
    params = {"embed.weight": P["E"]} | cell_params(cell, "rnn", P["fwd"])
    if bidirectional:
        params |= cell_params(cell, "rnn", P["bwd"], suffix="_l0_reverse")
    if bridge:
        params |= {"bridge_h.weight": P["W_b"], "bridge_h.bias": P["b_W_b"]}
        if cell == "lstm":
            params |= {"bridge_c.weight": P["W_bc"], "bridge_c.bias": P["b_W_bc"]}
    set_params(encoder, params)
    src = torch.tensor([[4, 5, 1, 3], [5, 3, PAD, PAD]])
    mask = src != PAD
    ref = encoder_reference(P, cell, bidirectional, bridge, src, mask)
    with torch.no_grad():
        enc = encoder(src, mask)
    for key, value in ref.items():
        torch.testing.assert_close(enc[key], value, atol=1e-5, rtol=1e-5, msg=key)


def test_embeddings_read_out_times_sqrt_e_and_the_tied_output_uses_them_as_stored():
    """model.embed_scale (the default): the lookup is sqrt(E) * E[y]; the output layer shares the stored rows."""
    torch.manual_seed(0)
    cfg = ModelConfig(arch="luong", dim=16, embed_dim=16, layers=1, dropout=0.0, tie_embeddings=True)
    model = build_model(cfg, 20, 20, joint=True)
    emb = model.decoder.embed
    tokens = torch.tensor([[5, 7, PAD]])
    torch.testing.assert_close(emb(tokens), 4.0 * emb.weight[tokens])  # sqrt(16) = 4
    assert model.decoder.output.weight is emb.weight and float(emb.weight[PAD].detach().abs().sum()) == 0.0
    assert abs(float(emb.weight[4:].detach().std()) - 16**-0.5) < 0.05  # stored N(0, 1/E)
    plain = build_model(
        ModelConfig(arch="luong", dim=16, embed_dim=16, layers=1, dropout=0.0, embed_scale=False), 20, 20, joint=True
    )
    torch.testing.assert_close(plain.decoder.embed(tokens), plain.decoder.embed.weight[tokens])
