"""Attention that costs what the mechanism costs: a local window scores and sums its 2D + 1 positions only and
builds no (B, T, S) tensor unless asked; additive and concat scores never hold the (B, T, S, A) tensor. Each
against the straightforward computation (the dense masked window, the naive v^T tanh(q + k)) it replaces."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from nmt.config import ModelConfig
from nmt.models.attention import make_attention
from nmt.models.attention_cost import AdditiveScores, WindowDot, WindowSum, additive_scores
from nmt.models.builders import build_model
from tests.conftest import random_batch


class Shapes(TorchDispatchMode):
    """Records (op, dtype, shape) of every tensor any op returns inside the block, backward included."""

    def __init__(self):
        super().__init__()
        self.seen: list[tuple[str, torch.dtype, tuple[int, ...]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.seen += [(str(func), t.dtype, tuple(t.shape)) for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        return out

    def source_wide(self, S: int) -> list[tuple[str, torch.dtype, tuple[int, ...]]]:
        """Floating tensors of two dims or more whose last is S: weights over the source, (B, T, S) or (B, S)."""
        return [seen for seen in self.seen if seen[1].is_floating_point and len(seen[2]) >= 2 and seen[2][-1] == S]


def inputs(lengths, T, dim=8, values_dim=5, seed=0):
    """query (B, T, dim), keys (B, S, dim), values (B, S, values_dim), mask (B, S), steps (B, T)."""
    g = torch.Generator().manual_seed(seed)
    S = max(lengths)
    mask = torch.arange(S)[None, :] < torch.tensor(lengths)[:, None]
    steps = torch.arange(T).expand(len(lengths), T)
    return (
        torch.randn(len(lengths), T, dim, generator=g),
        torch.randn(len(lengths), S, dim, generator=g),
        torch.randn(len(lengths), S, values_dim, generator=g),
        mask,
        steps,
    )


# local-p's v_p scaled: 0 gives p_t = S_b / 2 (an integer for even S_b, x.5 for odd), 1 p_t anywhere, 30 the ends
CASES = [
    # score, window, D, lengths (padding, shorter than 2D + 1, S < 2D + 1), T (past the ends for local-m), v_p scale
    ("dot", "local_m", 2, (13, 2, 9, 1), 16, None),
    ("general", "local_m", 3, (13, 6, 4), 15, None),
    ("general", "local_m", 7, (13, 2, 9), 11, None),  # W = min(15, 13): the whole source
    ("dot", "local_p", 2, (13, 2, 9, 1), 11, 1.0),
    ("general", "local_p", 2, (12, 7, 10, 1), 9, 0.0),  # p_t = 6, 3.5, 5, 0.5: integer and not
    ("general", "local_p", 3, (13, 2, 9), 40, 30.0),  # both ends of every sentence
    ("dot", "local_p", 4, (5, 3), 7, 1.0),  # S = 5 < 2D + 1 = 9
    ("additive", "local_p", 1, (13, 2, 9), 11, 1.0),
    ("concat", "local_m", 2, (13, 2, 9), 15, None),
]


@pytest.mark.parametrize("small_blocks", [False, True])
@pytest.mark.parametrize("score, window, D, lengths, T, v_p", CASES)
def test_window_only_equals_scoring_every_position_then_masking(
    score, window, D, lengths, T, v_p, small_blocks, monkeypatch
):
    """Weights, context and every gradient of the window-only forward equal the dense masked reference's, with the
    windows gathered all at once or a few queries at a time (small_blocks)."""
    torch.manual_seed(0)
    if small_blocks:  # three queries' windows (3 * W * 8 elements) or fewer at a time
        monkeypatch.setattr("nmt.models.attention_cost.CHUNK", 3 * (2 * D + 1) * 8)
        monkeypatch.setattr("nmt.models.attention_cost.KEEP", 0)
    attention = make_attention(score, 8, 8, 8, window=window, window_size=D)
    if v_p is not None:
        with torch.no_grad():
            attention.v_p.weight.mul_(v_p)
    query, keys, values, mask, steps = inputs(lengths, T)
    S = mask.size(1)
    leaves = [t.clone().requires_grad_() for t in (query, keys, values)]
    params = list(attention.parameters())

    def run(window_only: bool, need_weights: bool):
        q, k, v = leaves
        prepared = attention.prepare(k)
        if window_only:
            context, weights = attention(q, prepared, v, mask, steps, need_weights=need_weights)
            log_w = attention.log_weights(q, prepared, mask, steps).detach()
        else:
            log_w = attention.dense_log_weights(q, prepared, mask, steps)  # O(T * S), the reference
            weights = log_w.exp()
            context, log_w = weights @ v, log_w.detach()
        loss = (context**2).sum() + ((weights * torch.arange(float(S))).sum() if need_weights else 0)
        grads = torch.autograd.grad(loss, leaves + params, allow_unused=True)
        return log_w, None if weights is None else weights.detach(), context.detach(), grads

    dense = run(False, True)
    p = attention.positions(query, mask, steps)
    if v_p == 0.0:
        assert (p == p.round()).any() and (p != p.round()).any()
    if v_p == 30.0:
        assert (p < 0.5).any() and (p > mask.sum(1, keepdim=True) - 0.5).any()
    assert (dense[0].isneginf().sum(-1) < S).all()  # every window holds one real position at least
    for need_weights in (True, False):
        window_only = run(True, need_weights)
        assert torch.equal(window_only[0].isneginf(), dense[0].isneginf())  # the same positions allowed
        torch.testing.assert_close(
            window_only[0].masked_fill(window_only[0].isneginf(), 0), dense[0].masked_fill(dense[0].isneginf(), 0)
        )
        if need_weights:
            torch.testing.assert_close(window_only[1], dense[1])
        else:
            assert window_only[1] is None
        torch.testing.assert_close(window_only[2], dense[2])
        want = dense[3] if need_weights else run(False, False)[3]
        for got, expected in zip(window_only[3], want):
            assert (got is None) == (expected is None)
            if got is not None:  # sums over every query and key in another order: float32 rounding (rtol 1e-4
                # holds on AVX2 and AVX-512 CPUs, whose kernels round differently)
                torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("window", ["local_m", "local_p"])
def test_window_only_builds_no_source_wide_tensor_unless_asked(window):
    """need_weights=False: no tensor over the source (B, T, S) in the forward or the backward; the cost is
    O(T * D). Asked for, the weights (B, T, S) are there."""
    torch.manual_seed(0)
    attention = make_attention("general", 8, 8, 8, window=window, window_size=2)
    query, keys, values, mask, steps = inputs((97, 60), T=40, values_dim=6)
    query.requires_grad_(), keys.requires_grad_()
    with Shapes() as shapes:
        context, weights = attention(query, attention.prepare(keys), values, mask, steps, need_weights=False)
        context.square().sum().backward()
    assert weights is None and shapes.seen and not shapes.source_wide(97)
    assert max(numel for *_, shape in shapes.seen if (numel := torch.Size(shape).numel())) < 2 * 40 * 97
    with Shapes() as shapes:
        _, weights = attention(query, attention.prepare(keys), values, mask, steps)
    assert weights.shape == (2, 40, 97) and shapes.source_wide(97)


@pytest.mark.parametrize(
    "score, window, kind",
    [
        ("dot", "global", "soft"),
        ("additive", "global", "soft"),
        ("general", "local_p", "hard"),
        ("concat", "local_m", "soft"),
    ],
)
def test_need_weights_false_returns_the_same_context_and_no_weights(score, window, kind):
    torch.manual_seed(0)
    attention = make_attention(score, 8, 8, 8, window=window, window_size=2, kind=kind).eval()
    query, keys, values, mask, steps = inputs((9, 4), T=6)
    prepared = attention.prepare(keys)
    with torch.no_grad():
        context, weights = attention(query, prepared, values, mask, steps)
        alone, none = attention(query, prepared, values, mask, steps, need_weights=False)
    assert weights.shape == (2, 6, 9) and none is None
    torch.testing.assert_close(alone, context)


@pytest.mark.parametrize("score, window", [("general", "local_p"), ("dot", "local_m"), ("additive", "local_p")])
def test_local_windows_train_under_cpu_bf16_autocast(score, window):
    """Window-only attention under torch.autocast('cpu', bfloat16): finite fp32 gradients, a context near fp32's."""
    torch.manual_seed(0)
    attention = make_attention(score, 8, 8, 8, window=window, window_size=2)
    query, keys, values, mask, steps = inputs((9, 4), T=6)
    exact, _ = attention(query, attention.prepare(keys), values, mask, steps)
    query.requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        context, _ = attention(query, attention.prepare(keys), values, mask, steps, need_weights=False)
    context.float().square().sum().backward()
    for name, param in [("query", query), *attention.named_parameters()]:
        assert param.grad is not None and param.grad.dtype == torch.float32, name
        assert param.grad.isfinite().all() and param.grad.abs().sum() > 0, name
    torch.testing.assert_close(context.float(), exact, atol=0.05, rtol=0.05)


def tiny_rnn(**overrides):
    torch.manual_seed(0)
    cfg = ModelConfig(**({"dim": 16, "layers": 1, "dropout": 0.0, "window_size": 2} | overrides))
    return build_model(cfg, 20, 20, joint=True)


@pytest.mark.parametrize(
    "overrides",
    [
        dict(arch="luong", score="general", window="local_p", input_feeding=False),  # all positions in one call
        dict(arch="luong", score="dot", window="local_m"),  # step by step (input feeding)
        dict(arch="bahdanau", score="additive", window="local_p"),
    ],
)
def test_teacher_forcing_builds_no_source_wide_attention_but_search_still_gets_it(overrides):
    """Training's features(need_attn=False) never builds (B, T, S) or (B, S) weights for a local window; the
    features equal need_attn=True's, and step still returns each row's attention (B, S)."""
    model = tiny_rnn(**overrides)
    batch = random_batch(20, src_lens=(37, 30, 5), tgt_lens=(9, 2, 4), seed=1)
    S = batch.src.size(1)
    enc = model.encode(batch.src, batch.src_mask)
    with Shapes() as shapes:
        features, attn = model.decoder.features(batch.tgt_in, enc)
        features.square().sum().backward()
    assert attn is None and not shapes.source_wide(S)
    model.zero_grad()
    with torch.no_grad():
        enc = model.encode(batch.src, batch.src_mask)
        with Shapes() as shapes:
            asked, attn = model.decoder.features(batch.tgt_in, enc, need_attn=True)
        assert attn.shape == (3, batch.tgt_in.size(1), S) and shapes.source_wide(S)
        torch.testing.assert_close(asked, model.decoder.features(batch.tgt_in, enc)[0])
        _, _, row = model.step(batch.tgt_in[:, 0], enc, model.init_state(enc))
        assert row.shape == (3, S)
        torch.testing.assert_close(row, attn[:, 0])


@pytest.mark.parametrize("chunk", [1, 2 * 3 * 4, 10**6])  # one query's window at a time, two queries, all
def test_window_products_gradients_are_exact(chunk, monkeypatch):
    """gradcheck in float64 of both window products, their table rows repeated across queries and windows."""
    monkeypatch.setattr("nmt.models.attention_cost.CHUNK", chunk)
    g = torch.Generator().manual_seed(0)
    x, a, table = (torch.randn(*shape, generator=g, dtype=torch.float64) for shape in ((5, 4), (5, 3), (6, 4)))
    index = torch.tensor([[0, 1, 2], [1, 2, 3], [3, 4, 5], [3, 4, 5], [0, 0, 5]])  # (N=5, W=3) rows of the table
    leaves = [t.requires_grad_() for t in (x, a, table)]
    assert torch.autograd.gradcheck(lambda x, table: WindowDot.apply(x, table, index), [leaves[0], leaves[2]])
    assert torch.autograd.gradcheck(lambda a, table: WindowSum.apply(a, table, index), [leaves[1], leaves[2]])
    torch.testing.assert_close(WindowDot.apply(x, table, index), torch.einsum("nk,nwk->nw", x, table[index]))
    torch.testing.assert_close(WindowSum.apply(a, table, index), torch.einsum("nw,nwk->nk", a, table[index]))


def naive_additive(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return torch.tanh(q[:, :, None, :] + k[:, None, :, :]) @ v  # (B, T, S, A) @ (A,) -> (B, T, S)


# chunk sizes (elements) for A = 4, S = 5, T = 3, B = 2: split S (1, 8), T (20, 40), B (60), none (10**6)
CHUNKS = [1, 8, 20, 40, 60, 10**6]


@pytest.mark.parametrize("chunk", CHUNKS)
def test_additive_scores_gradients_are_exact(chunk):
    """gradcheck in float64: the blockwise backward (tanh recomputed per block) is the true gradient."""
    g = torch.Generator().manual_seed(chunk)
    q, k, v = (torch.randn(*shape, generator=g, dtype=torch.float64) for shape in ((2, 3, 4), (2, 5, 4), (4,)))
    leaves = [t.requires_grad_() for t in (q, k, v)]
    assert torch.autograd.gradcheck(lambda q, k, v: AdditiveScores.apply(q, k, v, chunk), leaves)


@pytest.mark.parametrize("chunk", CHUNKS)
def test_additive_scores_equal_the_naive_formula(chunk):
    """fp32 scores and gradients equal v^T tanh(q_t + k_s) computed over the whole (B, T, S, A) tensor."""
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(*shape, generator=g) for shape in ((2, 3, 4), (2, 5, 4), (4,)))
    upstream = torch.randn(2, 3, 5, generator=g)
    results = []
    for fn in (naive_additive, lambda q, k, v: additive_scores(q, k, v, chunk)):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        scores = fn(*leaves)
        results.append((scores.detach(), *torch.autograd.grad((scores * upstream).sum(), leaves)))
    for got, want in zip(*results):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("score", ["additive", "concat"])
def test_additive_and_concat_never_hold_the_four_way_tensor(score, monkeypatch):
    """With blocks of 64 elements, no tensor in the forward or backward of (B, T, S, A) = (2, 6, 7, 8) holds a
    quarter of the (B, T, S, A) tensor (the largest are the weights, keys and scores); the result equals that of
    one block."""
    torch.manual_seed(0)
    attention = make_attention(score, 8, 8, 8)
    query, keys, values, mask, _ = inputs((7, 4), T=6)
    query.requires_grad_()
    whole, _ = attention(query, attention.prepare(keys), values, mask)
    monkeypatch.setattr("nmt.models.attention_cost.CHUNK", 64)
    monkeypatch.setattr("nmt.models.attention_cost.KEEP", 0)  # not one block kept whole
    with Shapes() as shapes:
        context, _ = attention(query, attention.prepare(keys), values, mask, need_weights=False)
        context.sum().backward()
    assert max(torch.Size(shape).numel() for *_, shape in shapes.seen) < 2 * 6 * 7 * 8 // 4
    torch.testing.assert_close(context, whole)


@pytest.mark.parametrize("score", ["additive", "concat"])
def test_additive_and_concat_train_under_cpu_bf16_autocast(score):
    """Under torch.autocast('cpu', bfloat16) the scores come out in bf16, every parameter gets a finite fp32
    gradient, and the context stays near fp32's."""
    torch.manual_seed(0)
    attention = make_attention(score, 8, 8, 8)
    query, keys, values, mask, _ = inputs((7, 4), T=6)
    exact, _ = attention(query, attention.prepare(keys), values, mask)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        prepared = attention.prepare(keys)
        assert attention.score(query, prepared).dtype == torch.bfloat16
        context, _ = attention(query, prepared, values, mask)
    context.float().square().sum().backward()
    for name, param in attention.named_parameters():
        assert param.grad is not None and param.grad.dtype == torch.float32, name
        assert param.grad.isfinite().all() and param.grad.abs().sum() > 0, name
    torch.testing.assert_close(context.float(), exact, atol=0.05, rtol=0.05)


def test_parameter_names_and_shapes_are_unchanged():
    """Checkpoints written before these changes load: the same parameter names and shapes."""
    shapes = {
        name: {key: tuple(value.shape) for key, value in make_attention(*args).state_dict().items()}
        for name, args in {
            "additive": ("additive", 6, 8, 4),
            "concat": ("concat", 6, 8, 4),
            "local_p": ("general", 6, 8, 4, "local_p", 3),
            "hard_local_m": ("dot", 8, 8, 4, "local_m", 3, "hard"),
        }.items()
    }
    assert shapes == {
        "additive": {"W_a.weight": (4, 6), "U_a.weight": (4, 8), "U_a.bias": (4,), "v_a.weight": (1, 4)},
        "concat": {"W_a.weight": (4, 14), "v_a.weight": (1, 4)},
        "local_p": {"scorer.W_a.weight": (6, 8), "W_p.weight": (4, 6), "v_p.weight": (1, 4)},
        "hard_local_m": {},
    }
