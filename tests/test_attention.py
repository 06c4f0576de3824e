"""The attention zoo against its equations, on small hand-made tensors."""

import math

import pytest
import torch

from nmt.errors import NmtError
from nmt.models.attention import SCORES, HardAttention, LocalWindow, make_attention

# one query per sentence, three source positions; the second sentence's last position is padding
QUERY = torch.tensor([[[1.0, 2.0]], [[0.5, -1.0]]])  # (B=2, T=1, Q=2)
KEYS = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], [[2.0, 1.0], [-1.0, 0.5], [9.0, 9.0]]])  # (B, S=3, K=2)
MASK = torch.tensor([[True, True, True], [True, True, False]])


def set_weights(module: torch.nn.Module, **weights) -> None:
    with torch.no_grad():
        for name, value in weights.items():
            module.get_parameter(name).copy_(torch.tensor(value))


def score_of(attention, query=QUERY, keys=KEYS):
    return attention.score(query, attention.prepare(keys))


def by_hand(fn) -> torch.Tensor:
    """(B, 1, S) scores from fn(q, k) over every query and key."""
    return torch.tensor([[[fn(QUERY[b, 0], KEYS[b, s]) for s in range(3)]] for b in range(2)])


def test_dot_is_the_inner_product():
    torch.testing.assert_close(score_of(make_attention("dot", 2, 2, 2)), by_hand(lambda q, k: float(q @ k)))


def test_general_is_h_W_h_and_equals_dot_when_W_is_identity():
    general = make_attention("general", 2, 2, 2)
    W = [[1.0, 2.0], [3.0, 4.0]]
    set_weights(general, **{"W_a.weight": W})
    torch.testing.assert_close(score_of(general), by_hand(lambda q, k: float(q @ torch.tensor(W) @ k)))
    set_weights(general, **{"W_a.weight": torch.eye(2).tolist()})
    torch.testing.assert_close(score_of(general), score_of(make_attention("dot", 2, 2, 2)))


def test_additive_is_v_tanh_Wq_plus_Uk():
    additive = make_attention("additive", 2, 2, 3)
    W, U, b, v = (
        [[1.0, 0.0], [0.5, -1.0], [0.0, 2.0]],
        [[0.3, 0.2], [-1.0, 1.0], [0.0, 0.5]],
        [0.1, -0.2, 0.0],
        [[1.0, -2.0, 0.5]],
    )
    set_weights(additive, **{"W_a.weight": W, "U_a.weight": U, "U_a.bias": b, "v_a.weight": v})
    W, U, b, v = map(torch.tensor, (W, U, b, v))
    torch.testing.assert_close(score_of(additive), by_hand(lambda q, k: float(v[0] @ torch.tanh(W @ q + U @ k + b))))


def test_concat_is_v_tanh_W_of_the_concatenation():
    concat = make_attention("concat", 2, 2, 3)
    W, v = [[1.0, 0.0, 0.5, -1.0], [0.2, 0.3, -0.4, 1.0], [0.0, -1.0, 1.0, 0.0]], [[0.5, -1.0, 2.0]]
    set_weights(concat, **{"W_a.weight": W, "v_a.weight": v})
    W, v = torch.tensor(W), torch.tensor(v)
    torch.testing.assert_close(score_of(concat), by_hand(lambda q, k: float(v[0] @ torch.tanh(W @ torch.cat([q, k])))))


def test_location_scores_positions_from_the_query_alone():
    location = make_attention("location", 2, 2, 2, max_positions=2)
    W, b = [[1.0, -1.0], [0.5, 2.0]], [0.0, 1.0]
    set_weights(location, **{"W_a.weight": W, "W_a.bias": b})
    expected = (QUERY @ torch.tensor(W).T + torch.tensor(b))[:, :, [0, 1, 1]]  # position 2 shares the last row
    torch.testing.assert_close(score_of(location), expected)
    torch.testing.assert_close(score_of(location, keys=torch.zeros(2, 3, 2)), expected)  # keys do not matter


def test_softmax_and_weighted_sum_follow_the_equations():
    attention = make_attention("dot", 2, 2, 2)
    values = torch.randn(2, 3, 4)
    context, weights = attention(QUERY, attention.prepare(KEYS), values, MASK)
    scores = by_hand(lambda q, k: float(q @ k))
    expected = torch.stack([scores[0].softmax(-1), torch.cat([scores[1, :, :2].softmax(-1), torch.zeros(1, 1)], -1)])
    torch.testing.assert_close(weights, expected)
    torch.testing.assert_close(context, expected @ values)


def random_inputs(seed=0, lengths=(6, 2, 4), T=5, dim=8):
    g = torch.Generator().manual_seed(seed)
    S = max(lengths)
    mask = torch.arange(S)[None, :] < torch.tensor(lengths)[:, None]  # (B, S)
    steps = torch.arange(T).expand(len(lengths), T)
    return torch.randn(len(lengths), T, dim, generator=g), torch.randn(len(lengths), S, dim, generator=g), mask, steps


@pytest.mark.parametrize(
    "score, window", [(s, w) for s in SCORES for w in ("global", "local_m") if (s, w) != ("location", "local_m")]
)
def test_weights_sum_to_one_and_are_zero_on_padding(score, window):
    torch.manual_seed(0)
    attention = make_attention(score, 8, 8, 8, window=window, window_size=1)
    query, keys, mask, steps = random_inputs()
    _, weights = attention(query, attention.prepare(keys), keys, mask, steps)  # (B, T, S)
    torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[:2]))
    assert (weights.masked_select(~mask[:, None, :].expand_as(weights)) == 0).all()


def test_local_m_is_zero_outside_the_window_around_t():
    torch.manual_seed(0)
    D = 1
    attention = make_attention("general", 8, 8, 8, window="local_m", window_size=D)
    query, keys, mask, steps = random_inputs()
    with torch.no_grad():
        _, weights = attention(query, attention.prepare(keys), keys, mask, steps)
    lengths = mask.sum(1)
    for b in range(3):
        for t in range(5):
            p = min(t, int(lengths[b]) - 1)  # p_t = t, clamped to the last real position
            inside = [s for s in range(6) if abs(s - p) <= D and s < lengths[b]]
            outside = [s for s in range(6) if s not in inside]
            assert weights[b, t, outside].abs().sum() == 0, (b, t)
            assert weights[b, t, inside].sum() == pytest.approx(1.0, abs=1e-6)


def test_local_p_position_stays_within_each_true_length_and_weights_follow_eq_10():
    torch.manual_seed(0)
    D = 2
    attention = make_attention("dot", 8, 8, 8, window="local_p", window_size=D)
    assert isinstance(attention, LocalWindow)
    with torch.no_grad():
        attention.v_p.weight.mul_(20)  # saturate the sigmoid, pushing p_t to both ends
    query, keys, mask, steps = random_inputs(T=40)
    p = attention.positions(query, mask, steps).detach()  # (B, T)
    lengths = mask.sum(1, keepdim=True)
    assert (p >= 0).all() and (p <= lengths).all()
    assert (p < 0.5).any() and (p > lengths - 0.5).any()  # both ends reached
    with torch.no_grad():
        _, weights = attention(query, attention.prepare(keys), keys, mask, steps)
    scores = query @ keys.transpose(1, 2)
    for b in range(3):
        for t in range(40):
            inside = [s for s in range(6) if abs(s - float(p[b, t])) <= D and s < lengths[b]]
            align = scores[b, t, inside].softmax(-1)
            gauss = torch.tensor([math.exp(-((s - float(p[b, t])) ** 2) / (2 * (D / 2) ** 2)) for s in inside])
            expected = torch.zeros(6)
            expected[inside] = align * gauss
            torch.testing.assert_close(weights[b, t], expected, atol=1e-5, rtol=1e-4)
    assert (weights.sum(-1) <= 1 + 1e-6).all()


def test_local_p_position_gets_gradients():
    attention = make_attention("general", 8, 8, 8, window="local_p", window_size=2)
    query, keys, mask, steps = random_inputs()
    context, _ = attention(query, attention.prepare(keys), keys, mask, steps)
    context.sum().backward()
    assert attention.W_p.weight.grad.abs().sum() > 0 and attention.v_p.weight.grad.abs().sum() > 0


def test_unknown_names_list_the_valid_ones():
    with pytest.raises(
        NmtError, match="model.score=cosine: unknown; expected one of additive, dot, general, concat, location"
    ):
        make_attention("cosine", 8, 8, 8)
    with pytest.raises(NmtError, match="model.window=local: unknown; expected one of global, local_m, local_p"):
        make_attention("dot", 8, 8, 8, window="local")
    with pytest.raises(NmtError, match="model.attention=soft_hard: unknown; expected one of soft, hard"):
        make_attention("dot", 8, 8, 8, kind="soft_hard")


@pytest.mark.parametrize("window", ["local_m", "local_p"])
def test_location_with_a_local_window_is_refused(window):
    with pytest.raises(NmtError, match="location attention is global only"):
        make_attention("location", 8, 8, 8, window=window)


def test_prepare_keeps_nothing_on_the_module():
    attention = make_attention("additive", 8, 8, 8, window="local_p", window_size=2, kind="hard")
    before = {name: set(vars(m)) for name, m in attention.named_modules()}
    query, keys, mask, steps = random_inputs()
    attention(query, attention.prepare(keys), keys, mask, steps)
    assert {name: set(vars(m)) for name, m in attention.named_modules()} == before


def test_hard_attention_picks_the_argmax_at_inference_and_never_padding():
    torch.manual_seed(0)
    attention = make_attention("general", 8, 8, 8, kind="hard").eval()
    assert isinstance(attention, HardAttention)
    query, keys, mask, steps = random_inputs()
    prepared = attention.prepare(keys)
    context, weights = attention(query, prepared, keys, mask, steps)
    soft = attention.log_weights(query, prepared, mask, steps).exp()
    torch.testing.assert_close(weights, torch.nn.functional.one_hot(soft.argmax(-1), 6).float())
    torch.testing.assert_close(context, keys.gather(1, soft.argmax(-1)[..., None].expand(-1, -1, 8)))
    attention.train()
    for _ in range(20):
        _, weights = attention(query, prepared, keys, mask, steps)
        assert (weights.masked_select(~mask[:, None, :].expand_as(weights)).abs() < 1e-6).all()


def test_hard_attention_samples_from_a_t_with_straight_through_gradients():
    torch.manual_seed(0)
    attention = make_attention("dot", 2, 2, 2, kind="hard").train()
    query, keys, mask = QUERY[:1].expand(4000, -1, -1), KEYS[:1].expand(4000, -1, -1), MASK[:1].expand(4000, -1)
    _, weights = attention(query, attention.prepare(keys), keys, mask)  # (4000, 1, 3), one-hot rows
    torch.testing.assert_close(weights.sum(-1), torch.ones(4000, 1))
    frequencies = weights.detach().round().mean(0)[0]
    torch.testing.assert_close(frequencies, (QUERY[0] @ KEYS[0].T)[0].softmax(-1), atol=0.03, rtol=0)
    general = make_attention("general", 2, 2, 2, kind="hard").train()
    context, _ = general(query, general.prepare(keys), keys, mask)
    context.sum().backward()
    assert general.inner.W_a.weight.grad.abs().sum() > 0


def test_local_p_position_and_gaussian_worked_by_hand():
    """Eq. 9 and eq. 10 on numbers worked by hand, D = 2 (sigma = 1), true lengths 5 and 2.

    Fails if p_t used the padded length instead of S_b, another sigma than D / 2, no Gaussian, a
    renormalised Gaussian, or a window other than [p_t - D, p_t + D].
    """
    attention = make_attention("dot", 2, 2, 2, window="local_p", window_size=2)
    ln3 = math.log(3)
    set_weights(attention, **{"W_p.weight": [[1.0, 0.0], [0.0, 1.0]], "v_p.weight": [[2 * ln3, 0.0]]})
    query = torch.tensor([[[0.5 * ln3, 0.0]], [[0.5 * ln3, 0.0]]])  # (B=2, T=1, Q=2)
    keys = torch.tensor(
        [[[0.0, 1.0], [0.0, -2.0], [0.0, 0.5], [0.0, 3.0], [0.0, -1.0]]] * 2
    )  # (B, S=5, K): every dot score 0
    mask = torch.tensor([[True, True, True, True, True], [True, True, False, False, False]])
    # eq. 9: tanh(W_p h_t) = (tanh(ln(3) / 2), tanh(0)) = ((3 - 1) / (3 + 1), 0) = (0.5, 0)
    #        v_p^T (0.5, 0) = 2 ln 3 * 0.5 = ln 3;  sigmoid(ln 3) = 3 / (3 + 1) = 0.75
    #        p_t = S_b * 0.75 = 5 * 0.75 = 3.75 and 2 * 0.75 = 1.5
    torch.testing.assert_close(attention.positions(query, mask, None), torch.tensor([[3.75], [1.5]]))
    context, weights = attention(query, attention.prepare(keys), keys, mask)
    # eq. 10, sigma = D / 2 = 1: a_t(s) = align(s) * exp(-(s - p_t)^2 / 2),
    # align uniform over the window's real positions
    # sentence 1, p = 3.75: window [1.75, 5.75] -> s = 2, 3, 4, align 1/3 each
    #   exp(-1.75^2 / 2) / 3 = 0.216265 / 3 = 0.072088;  exp(-0.75^2 / 2) / 3 = 0.754840 / 3 = 0.251613;
    #   exp(-0.25^2 / 2) / 3 = 0.969233 / 3 = 0.323078
    # sentence 2, p = 1.5: window [-0.5, 3.5], real s = 0, 1, align 1/2 each
    #   exp(-1.5^2 / 2) / 2 = 0.324652 / 2 = 0.162326;  exp(-0.5^2 / 2) / 2 = 0.882497 / 2 = 0.441248
    expected = torch.tensor([[[0.0, 0.0, 0.072088, 0.251613, 0.323078]], [[0.162326, 0.441248, 0.0, 0.0, 0.0]]])
    torch.testing.assert_close(weights, expected, atol=1e-6, rtol=0)
    torch.testing.assert_close(context, expected @ keys)


def test_hard_attention_gradient_is_the_gumbel_softmax_relaxations():
    """With the Gumbel noise fixed, d(loss)/d(scores) of hard attention equals that of its relaxation
    y = softmax((log a + g) / tau) alone, computed in closed form and by autograd on the relaxation.

    Fails if the straight-through gradient went through a instead of y, left out tau or the noise, or
    if the forward pass did not take the argmax of y (here the noise moves it off argmax a).
    """
    tau = 0.5
    attention = make_attention("dot", 2, 2, 2, kind="hard", tau=tau).train()
    query = QUERY[:1].clone().requires_grad_()  # (1, 1, 2) = (1, 2)
    keys, mask = KEYS[:1], MASK[:1]  # keys (1, 0), (0, 1), (1, 1): scores (1, 2, 3), argmax a = 2
    values = torch.tensor([[[1.0, 0.0], [0.0, 2.0], [-1.0, 1.0]]])  # (1, S=3, 2)
    upstream = torch.tensor(
        [2.0, -1.0]
    )  # loss = upstream . c_t, so d(loss)/d(weight_s) = w_s = upstream . v_s = (2, -2, -3)
    noise = torch.tensor([[[0.1, 0.5, 1.5]]])  # the Exp(1) draws E; g = -log E = (2.302585, 0.693147, -0.405465)
    drawn = []

    def fixed_draw(tensor, *args, **kwargs):
        drawn.append(tensor.shape)
        return tensor.copy_(noise.expand_as(tensor))

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.Tensor, "exponential_", fixed_draw)
        context, weights = attention(query, attention.prepare(keys), values, mask)
    assert drawn == [torch.Size([1, 1, 3])]
    (context[0, 0] @ upstream).backward()

    scores = torch.tensor([1.0, 2.0, 3.0])
    gumbel = -noise[0, 0].log()
    y = torch.softmax((torch.log_softmax(scores, -1) + gumbel) / tau, -1)  # (0.650, 0.192, 0.158): argmax 0, not 2
    torch.testing.assert_close(weights.detach(), torch.tensor([[[1.0, 0.0, 0.0]]]))
    torch.testing.assert_close(context.detach(), values[:, :1])
    # closed form: d(loss)/d(z_s) = y_s (w_s - sum_j y_j w_j) / tau for z = log a + g; the log-softmax of the
    # scores adds -a_s * sum_k d(loss)/d(z_k) = 0, so d(loss)/d(scores) is the same vector
    w = values[0] @ upstream
    by_formula = y * (w - (y * w).sum()) / tau
    relaxed_scores = scores.clone().requires_grad_()
    relaxed = torch.softmax((torch.log_softmax(relaxed_scores, -1) + gumbel) / tau, -1) @ values[0]
    (relaxed @ upstream).backward()
    torch.testing.assert_close(relaxed_scores.grad, by_formula)
    torch.testing.assert_close(query.grad[0, 0], by_formula @ keys[0])  # scores_s = q . k_s
    soft = torch.softmax(scores, -1)  # the gradient soft attention would give instead
    assert not torch.allclose(query.grad[0, 0], (soft * (w - (soft * w).sum())) @ keys[0], atol=1e-3)


@pytest.mark.parametrize("window", ["global", "local_p"])
@pytest.mark.parametrize("kind", ["soft", "hard"])
def test_under_bf16_autocast_the_context_is_summed_from_the_fp32_values(window, kind):
    """The weighted sum c_t = sum_s a_t(s) v_s stays in the values' dtype under autocast: the encoder's fp32 memory
    is not rounded to bf16 (nor cast again at every decoder step), and its gradient adds up in fp32."""
    torch.manual_seed(0)
    attention = make_attention("general", 8, 8, 8, window=window, window_size=2, kind=kind).eval()
    query, values = torch.randn(3, 4, 8), (torch.randn(3, 9, 8) * 1.001).requires_grad_()
    mask, steps = torch.ones(3, 9, dtype=torch.bool), torch.arange(4).expand(3, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        prepared = attention.prepare(values)
        context, weights = attention(query, prepared, values, mask, steps)
    assert context.dtype == torch.float32
    torch.testing.assert_close(context, weights.float() @ values, rtol=1e-6, atol=1e-6)  # not values.bfloat16()
    assert not torch.allclose(weights.float() @ values.bfloat16().float(), context, rtol=1e-6, atol=1e-6)
    context.sum().backward()
    assert values.grad.dtype == torch.float32
    # without autocast: the plain product
    plain, plain_weights = attention(query, prepared.float(), values, mask, steps)
    torch.testing.assert_close(plain, plain_weights @ values)
