"""The attention zoo: one base module, the classic scores, local windows, and hard attention.

Every attention computes, for a query q_t and keys/values k_s, v_s over the real source positions,
    a_t(s) = exp(score(q_t, k_s)) / sum_s' exp(score(q_t, k_s'))     (Luong et al. 2015, eq. 7)
    c_t    = sum_s a_t(s) v_s                                         (Bahdanau et al. 2014, eq. 5)
A variant writes `prepare(keys)`, the part that does not depend on the query (e.g. U_a k_s), computed
once per batch, and `score(query, prepared) -> (B, T, S)`. The base module does masking, softmax and
the weighted sum. `prepare`'s result goes back to the caller, which keeps it in the decoder state:
no module holds per-batch tensors, so beam search can reorder it with the rest of the state.

Scores (SCORES):
    additive  v_a^T tanh(W_a q_t + U_a k_s)                Bahdanau et al. 2014, eq. 6 and appendix A.1.2
    dot       q_t^T k_s                                    Luong et al. 2015, eq. 8
    general   q_t^T W_a k_s                                Luong et al. 2015, eq. 8
    concat    v_a^T tanh(W_a [q_t; k_s])                   Luong et al. 2015, eq. 8
    location  a_t = softmax(W_a q_t), keys unused          Luong et al. 2015, sec. 3.1
Windows (WINDOWS; Luong et al. 2015, sec. 3.2), around any score except location:
    global    every real position
    local_m   p_t = t (monotonic), window [p_t - D, p_t + D]
    local_p   p_t = S_b * sigmoid(v_p^T tanh(W_p q_t))     (eq. 9), S_b the sentence's true length;
              a_t(s) = softmax-in-window(score) * exp(-(s - p_t)^2 / (2 sigma^2)), sigma = D / 2   (eq. 10)
Kinds (KINDS): soft (the expectation above) or hard (one sampled position, see HardAttention).

Cost: what the mechanism costs. Global scores are O(T * S) per sentence; additive and concat compute
v_a^T tanh(q_t + k_s) a block at a time (`additive_scores`), never holding the (B, T, S, A) tensor. A local
window scores and sums only the W = 2D + 1 positions around p_t, O(T * D) (`LocalWindow.window`; dot and
general without gathering all (B, T, W, K) rows at once: `window_dot`, `window_sum`). Those blocked and windowed
products, with their hand-written backward passes, are in nmt.models.attention_cost. A window's (B, T, S) weights
are built only when a caller asks for them (`need_weights`), as search and the attention probes do and
teacher forcing does not.

Shape legend: B batch, T query steps, S source length, Q query dim, K key dim, A attention hidden size,
W positions of a local window, N = B * T query rows, M = B * S key rows.
Masks are bool, True = real token.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from nmt.errors import NmtError
from nmt.models.attention_cost import additive_scores, flat_windows, gathered, window_dot, window_sum
from nmt.models.checks import KINDS, WINDOWS, check_attention  # noqa: F401 (re-exported)


def masked_log_softmax(scores: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """log softmax over the last dim where `allowed` (broadcastable bool); -inf elsewhere."""
    return scores.masked_fill(~allowed, float("-inf")).log_softmax(-1)


def weighted_sum(
    weights: torch.Tensor,
    values: torch.Tensor,
    combine: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = torch.matmul,
) -> torch.Tensor:
    """c_t = sum_s a_t(s) v_s, `combine(weights, values)`, in the values' dtype even under autocast.

    Autocast would cast the values (the encoder's fp32 memory, (B, S, H)) to bf16 at every decoder step and the
    gradient back at every step of the backward pass: 2 of the 3 largest copies of a bf16 RNN update, for a product
    (one query row per sentence) too small to run faster in bf16. In fp32 the weights (B, T, S) are cast instead,
    and the memory's gradient adds up over the steps in fp32. Without autocast, `combine(weights, values)`.
    """
    if not torch.is_autocast_enabled(values.device.type):
        return combine(weights, values)
    with torch.autocast(values.device.type, enabled=False):
        return combine(weights.to(values.dtype), values)


class Attention(nn.Module):
    """The base: masking, softmax and the weighted sum. Subclasses write `prepare` and `score`, and may write
    `score_window` (a local window's scores; dot and general read each query's W keys without gathering them)."""

    def prepare(self, keys: torch.Tensor) -> torch.Tensor:
        """Keys (B, S, K) -> what `score` reads (B, S, *), computed once per batch. Identity by default."""
        return keys

    def score(self, query: torch.Tensor, prepared: torch.Tensor) -> torch.Tensor:
        """query (B, T, Q), prepared keys (B, S, *) -> scores (B, T, S)."""
        raise NotImplementedError

    def score_window(self, query: torch.Tensor, prepared: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
        """Scores (B, T, W) of each query at its own W positions source (B, T, W) (a local window): by default
        `score` over the gathered keys (B, T, W, *), one sentence of one query per (b, t)."""
        (B, T, W), S = source.shape, prepared.size(1)
        keys = gathered(prepared.reshape(B * S, -1), flat_windows(source, S))  # (B * T, W, *)
        return self.score(query.reshape(B * T, 1, -1), keys).view(B, T, W)

    def log_weights(
        self, query: torch.Tensor, prepared: torch.Tensor, mask: torch.Tensor, steps: torch.Tensor | None = None
    ) -> torch.Tensor:
        """log a_t(s) (B, T, S), -inf on padding. mask (B, S); steps (B, T) target positions (local windows)."""
        return masked_log_softmax(self.score(query, prepared), mask[:, None, :])

    def forward(
        self,
        query: torch.Tensor,
        prepared: torch.Tensor,
        values: torch.Tensor,
        mask: torch.Tensor,
        steps: torch.Tensor | None = None,
        need_weights: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Context c_t (B, T, H) and weights a_t (B, T, S) (None unless need_weights) for queries (B, T, Q)
        over values (B, S, H)."""
        weights = self.log_weights(query, prepared, mask, steps).exp()  # (B, T, S)
        return weighted_sum(weights, values), weights if need_weights else None


class Additive(Attention):
    """Bahdanau et al. 2014, appendix A.1.2: e_ts = v_a^T tanh(W_a q_t + U_a k_s)."""

    def __init__(self, query_dim: int, key_dim: int, attn_dim: int):
        super().__init__()
        self.W_a = nn.Linear(query_dim, attn_dim, bias=False)
        self.U_a = nn.Linear(key_dim, attn_dim)
        self.v_a = nn.Linear(attn_dim, 1, bias=False)

    def prepare(self, keys: torch.Tensor) -> torch.Tensor:
        return self.U_a(keys)  # (B, S, A)

    def score(self, query: torch.Tensor, prepared: torch.Tensor) -> torch.Tensor:
        return additive_scores(self.W_a(query), prepared, self.v_a.weight[0])  # (B, T, S)


class Dot(Attention):
    """Luong et al. 2015, eq. 8: score(h_t, h_s) = h_t^T h_s."""

    def __init__(self, query_dim: int, key_dim: int):
        super().__init__()
        if query_dim != key_dim:
            raise NmtError(f"model.score=dot needs queries and keys of one size; got {query_dim} and {key_dim}")

    def score(self, query: torch.Tensor, prepared: torch.Tensor) -> torch.Tensor:
        return query @ prepared.transpose(1, 2)  # (B, T, S)

    def score_window(self, query: torch.Tensor, prepared: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
        return window_dot(query, prepared, source)  # (B, T, W)


class General(Attention):
    """Luong et al. 2015, eq. 8: score(h_t, h_s) = h_t^T W_a h_s; prepare computes W_a h_s."""

    def __init__(self, query_dim: int, key_dim: int):
        super().__init__()
        self.W_a = nn.Linear(key_dim, query_dim, bias=False)

    def prepare(self, keys: torch.Tensor) -> torch.Tensor:
        return self.W_a(keys)  # (B, S, Q)

    def score(self, query: torch.Tensor, prepared: torch.Tensor) -> torch.Tensor:
        return query @ prepared.transpose(1, 2)  # (B, T, S)

    def score_window(self, query: torch.Tensor, prepared: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
        return window_dot(query, prepared, source)  # (B, T, W)


class Concat(Attention):
    """Luong et al. 2015, eq. 8: score(h_t, h_s) = v_a^T tanh(W_a [h_t; h_s]).

    W_a [h_t; h_s] = W_a[:, :Q] h_t + W_a[:, Q:] h_s, so prepare computes the key half once per batch.
    """

    def __init__(self, query_dim: int, key_dim: int, attn_dim: int):
        super().__init__()
        self.query_dim = query_dim
        self.W_a = nn.Linear(query_dim + key_dim, attn_dim, bias=False)
        self.v_a = nn.Linear(attn_dim, 1, bias=False)

    def prepare(self, keys: torch.Tensor) -> torch.Tensor:
        return keys @ self.W_a.weight[:, self.query_dim :].T  # (B, S, A)

    def score(self, query: torch.Tensor, prepared: torch.Tensor) -> torch.Tensor:
        q = query @ self.W_a.weight[:, : self.query_dim].T  # (B, T, A)
        return additive_scores(q, prepared, self.v_a.weight[0])  # (B, T, S)


class Location(Attention):
    """Luong et al. 2015, sec. 3.1: a_t = softmax(W_a h_t), one row of W_a per source position.

    The keys only give the source length. Positions at or past `max_positions` share the last row.
    """

    def __init__(self, query_dim: int, max_positions: int):
        super().__init__()
        self.W_a = nn.Linear(query_dim, max_positions)

    def prepare(self, keys: torch.Tensor) -> torch.Tensor:
        return keys[:, :, :0]  # (B, S, 0): the length is all the score needs

    def score(self, query: torch.Tensor, prepared: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(prepared.size(1), device=query.device).clamp(max=self.W_a.out_features - 1)
        return self.W_a(query)[:, :, positions]  # (B, T, S)


class LocalWindow(Attention):
    """Luong et al. 2015, sec. 3.2: attend only to [p_t - D, p_t + D] around an aligned position p_t.

    local-m: p_t = t, clamped to the sentence's last real position so a long output never faces an empty window.
    local-p: p_t = S_b * sigmoid(v_p^T tanh(W_p h_t)) (eq. 9) with S_b the true source length, and the
    in-window weights are multiplied by exp(-(s - p_t)^2 / (2 sigma^2)), sigma = D / 2 (eq. 10). As in
    the paper they are not renormalised afterwards, so local-p weights sum to at most 1.

    Only the window is scored and summed (`window`): each query gathers the W = min(2D + 1, S) positions
    from ceil(p_t - D), so a step costs O(D), not O(S). The weights (B, T, S) are scattered out of the
    window only when asked for (`need_weights`). `dense_log_weights` scores every position and masks: the
    same weights at O(S) a step, the reference the window is tested against.
    """

    def __init__(self, scorer: Attention, predictive: bool, size: int, query_dim: int, attn_dim: int):
        super().__init__()
        if size < 1:
            raise NmtError(f"model.window_size={size}: a local window needs D >= 1")
        self.scorer, self.predictive, self.size, self.sigma = scorer, predictive, size, size / 2
        if predictive:
            self.W_p = nn.Linear(query_dim, attn_dim, bias=False)
            self.v_p = nn.Linear(attn_dim, 1, bias=False)

    def prepare(self, keys: torch.Tensor) -> torch.Tensor:
        return self.scorer.prepare(keys)

    def score(self, query: torch.Tensor, prepared: torch.Tensor) -> torch.Tensor:
        return self.scorer.score(query, prepared)

    def positions(self, query: torch.Tensor, mask: torch.Tensor, steps: torch.Tensor | None) -> torch.Tensor:
        """Aligned source positions p_t (B, T), real-valued for local-p; always fp32.

        Positions, distances and the Gaussian stay in fp32 under bf16 autocast: bf16 has 8 significant bits,
        so above 256 positions collide and a p_t of 200.4 would become 200.0.
        """
        length = mask.sum(1, keepdim=True)  # (B, 1) S_b
        if self.predictive:
            return length * torch.sigmoid(self.v_p(torch.tanh(self.W_p(query))).float()).squeeze(-1)  # eq. 9
        if steps is None:
            raise ValueError("local_m attention needs the target positions (steps)")
        return torch.minimum(steps, length - 1).float()

    def window(
        self, query: torch.Tensor, prepared: torch.Tensor, mask: torch.Tensor, p: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """log a_t (B, T, W) over the W = min(2D + 1, S) positions (B, T, W) that hold each window, for p_t (B, T).

        The positions start at ceil(p_t - D), shifted to stay inside the padded source: every s with
        |s - p_t| <= D is among them. Each query is scored against its own W keys only (the scorer's
        `score_window`); positions outside the window or on padding get -inf, as in `dense_log_weights`.
        """
        (B, T), S = p.shape, mask.size(1)
        width = min(2 * self.size + 1, S)
        start = torch.ceil(p - self.size).long().clamp(0, S - width)  # (B, T)
        source = start[:, :, None] + torch.arange(width, device=p.device)  # (B, T, W) s
        distance = source.float() - p[:, :, None]  # (B, T, W): s - p_t, fp32
        inside = (distance.abs() <= self.size) & mask.gather(1, source.flatten(1)).view(B, T, width)
        return self.in_window(self.scorer.score_window(query, prepared, source), distance, inside), source

    def log_weights(
        self, query: torch.Tensor, prepared: torch.Tensor, mask: torch.Tensor, steps: torch.Tensor | None = None
    ) -> torch.Tensor:
        """log a_t (B, T, S): the window's, -inf elsewhere."""
        log_window, source = self.window(query, prepared, mask, self.positions(query, mask, steps))  # (B, T, W)
        return log_window.new_full((*source.shape[:2], mask.size(1)), float("-inf")).scatter(-1, source, log_window)

    def forward(
        self,
        query: torch.Tensor,
        prepared: torch.Tensor,
        values: torch.Tensor,
        mask: torch.Tensor,
        steps: torch.Tensor | None = None,
        need_weights: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The context c_t (B, T, H) from the window's values alone; the weights (B, T, S), the window's
        scattered into zeros, only if need_weights."""
        log_window, source = self.window(query, prepared, mask, self.positions(query, mask, steps))
        window = log_window.exp()  # (B, T, W)
        context = weighted_sum(window, values, lambda w, v: window_sum(w, v, source))  # (B, T, H)
        if not need_weights:
            return context, None
        return context, window.new_zeros(*source.shape[:2], mask.size(1)).scatter(-1, source, window)  # (B, T, S)

    def dense_log_weights(
        self, query: torch.Tensor, prepared: torch.Tensor, mask: torch.Tensor, steps: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The same log a_t (B, T, S) computed over every source position, then masked: O(T * S).

        The straightforward reading of the equations, kept as the reference the window is tested against
        (and whose cost scripts/bench_attention.py plots as "masked (was)").
        """
        p = self.positions(query, mask, steps)  # (B, T)
        source = torch.arange(mask.size(1), device=query.device, dtype=torch.float32)
        distance = source[None, None, :] - p[:, :, None]  # (B, T, S): s - p_t, fp32
        inside = (distance.abs() <= self.size) & mask[:, None, :]
        return self.in_window(self.score(query, prepared), distance, inside)

    def in_window(self, scores: torch.Tensor, distance: torch.Tensor, inside: torch.Tensor) -> torch.Tensor:
        """log softmax of the scores inside the window; local-p adds the Gaussian -(s - p_t)^2 /
        (2 sigma^2) (eq. 10, in log space)."""
        log_a = masked_log_softmax(scores, inside)
        return log_a - distance**2 / (2 * self.sigma**2) if self.predictive else log_a


class HardAttention(Attention):
    """Hard attention: the context is the value at one source position, drawn from a_t (Xu et al. 2015).

    Training samples the position with the Gumbel-max trick and back-propagates through the
    Gumbel-softmax relaxation (straight-through estimator; Jang et al. 2017, Maddison et al. 2017):
        y = softmax((log a_t + g) / tau),  g_s = -log(-log u_s), u_s ~ U(0, 1)
        forward: one_hot(argmax y);  backward: d/d(log a_t) of y
    Inference takes argmax_s a_t(s).

    Why straight-through Gumbel-softmax rather than REINFORCE with a moving-average baseline: its
    gradient is a low-variance (if biased) path derivative through the same scorer, so hard attention
    trains with the soft model's learning rate and schedule and no reward, baseline or entropy
    hyper-parameters; and it needs no extra loss term, so the generic trainer trains it unchanged.
    REINFORCE is unbiased but its score-function gradient is noisy enough that hard models usually
    need the soft model's pre-training or variance tricks to train on small data in few steps.
    """

    def __init__(self, inner: Attention, tau: float):
        super().__init__()
        if tau <= 0:
            raise NmtError(f"model.gumbel_tau={tau}: expected a positive temperature")
        self.inner, self.tau = inner, tau

    def prepare(self, keys: torch.Tensor) -> torch.Tensor:
        return self.inner.prepare(keys)

    def score(self, query: torch.Tensor, prepared: torch.Tensor) -> torch.Tensor:
        return self.inner.score(query, prepared)

    def log_weights(
        self, query: torch.Tensor, prepared: torch.Tensor, mask: torch.Tensor, steps: torch.Tensor | None = None
    ) -> torch.Tensor:
        return self.inner.log_weights(query, prepared, mask, steps)

    def forward(
        self,
        query: torch.Tensor,
        prepared: torch.Tensor,
        values: torch.Tensor,
        mask: torch.Tensor,
        steps: torch.Tensor | None = None,
        need_weights: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The context (B, T, H) at the drawn position, and the one-hot weights (B, T, S) if need_weights
        (built in any case: the draw reads log a_t (B, T, S), a local window's scattered out of its W positions)."""
        log_a = self.log_weights(query, prepared, mask, steps)  # (B, T, S), -inf where not allowed
        if not self.training:
            weights = torch.zeros_like(log_a).scatter_(-1, log_a.argmax(-1, keepdim=True), 1.0)
            return weighted_sum(weights, values), weights if need_weights else None
        exp_noise = (
            torch.empty_like(log_a).exponential_().clamp_min(torch.finfo(log_a.dtype).tiny)
        )  # E ~ Exp(1), never 0
        gumbel = -exp_noise.log()  # -log(E) is Gumbel(0, 1)
        soft = ((log_a + gumbel) / self.tau).softmax(-1)  # (B, T, S)
        hard = torch.zeros_like(soft).scatter_(-1, soft.argmax(-1, keepdim=True), 1.0)
        weights = hard - soft.detach() + soft  # straight-through: one-hot forward, relaxed gradient
        return weighted_sum(weights, values), weights if need_weights else None


# name -> builder(query_dim, key_dim, attn_dim, max_positions)
SCORES: dict[str, Callable[[int, int, int, int], Attention]] = {
    "additive": lambda q, k, a, p: Additive(q, k, a),
    "dot": lambda q, k, a, p: Dot(q, k),
    "general": lambda q, k, a, p: General(q, k),
    "concat": lambda q, k, a, p: Concat(q, k, a),
    "location": lambda q, k, a, p: Location(q, p),
}


def make_attention(
    score: str,
    query_dim: int,
    key_dim: int,
    attn_dim: int,
    window: str = "global",
    window_size: int = 10,
    kind: str = "soft",
    max_positions: int = 256,
    tau: float = 1.0,
) -> Attention:
    """The score from SCORES, wrapped in a local window and/or made hard as asked."""
    check_attention(score, window, kind)
    attention = SCORES[score](query_dim, key_dim, attn_dim, max_positions)
    if window != "global":
        attention = LocalWindow(attention, window == "local_p", window_size, query_dim, attn_dim)
    if kind == "hard":
        attention = HardAttention(attention, tau)
    return attention
