"""Bahdanau's decoder under teacher forcing as one autograd operation (`train.decoder_loop`): the same equations as
nmt.models.bahdanau, computed in the order training can afford.

Teacher forcing knows every input token, so only what depends on s_{i-1} has to wait for the step before:

    hoisted out of the loop   E y_{i-1}'s part of the GRU input, W_ih^E E y_{i-1} + b_ih, for every i at once; the
                              readout t~_i = U_o s_{i-1} + V_o E y_{i-1} + C_o c_i, its maxout and dropout, for every
                              i at once (nothing in the loop reads t_i)
    in the loop, per step     [W_a; W_hh] s_{i-1} in one product; e_ij = v_a^T tanh(W_a s_{i-1} + U_a h_j) (`Scores`);
                              a_i = softmax(e_i) over the real source positions; c_i = sum_j a_ij h_j;
                              s_i = GRU(s_{i-1}, W_ih^C c_i + the hoisted part)

The backward pass is written out (back-propagation through time) rather than recorded: per step it computes the
gradients that flow on to s_{i-1} and adds the keys' gradient in place, and the weights' gradients, sums over all
steps, are one product each after the loop ([W_a; W_hh] from the stacked step gradients and states, W_ih^C from them
and the contexts, the memory's from the weights and the contexts' gradients). `Scores` computes e_ij and its
backward: `TorchScores` in the inputs' dtype, or nmt's C kernel for bf16 (nmt/training/native_attention.py), which
reads each (B, S, A) product once per pass instead of torch's ten. Under bf16 autocast the products run in bf16 as
autocast would run them, the softmax, the contexts and the state in float32.

It covers the recipes' decoder: a GRU of one layer with the additive (global, soft) score; any other decoder runs
the step-by-step loop (`RNNDecoder.features`). Equal to that loop in float64 (tests/test_bahdanau_loop.py), within
rounding in float32 and bf16; the readout's dropout draws one (B, T, E) mask instead of T of (B, E).

Shape legend: B batch, S source length, T target length, E embedding, H hidden, A attention size, G = 3H (the GRU's
gates r, z, n).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch
import torch.nn.functional as F
from torch import Tensor


class TorchScores:
    """e_bs = v^T tanh(q_b + k_bs) for one decoder step and its backward, in torch, in the dtype of q and keys (the
    backward recomputes the tanh). The interface of every `Scores` (nmt/training/native_attention.py's C kernel)."""

    def forward(self, q: Tensor, keys: Tensor, v: Tensor) -> Tensor:
        """q (B, A), keys (B, S, A), v (A,) -> scores (B, S)."""
        return torch.tanh(q[:, None, :] + keys) @ v.to(q.dtype)

    def backward(self, q: Tensor, keys: Tensor, v: Tensor, grad: Tensor, dkeys: Tensor, dv_rows: Tensor) -> Tensor:
        """From the scores' gradient grad (B, S): q's gradient (B, A), the keys' added into dkeys (B, S, A), each
        sentence's part of v's added into dv_rows (B, A)."""
        hidden = torch.tanh(q[:, None, :] + keys).to(dkeys.dtype)  # (B, S, A)
        dv_rows += (hidden * grad[:, :, None]).sum(1)
        u = hidden.mul_(hidden).neg_().add_(1).mul_(grad[:, :, None]).mul_(v.to(dkeys.dtype))  # g (1 - h^2) v
        dkeys += u
        return u.sum(1)


Scores = TorchScores  # what looped_by takes: TorchScores or a subclass


_SCORES: ContextVar[Scores | None] = ContextVar("decoder_loop", default=None)


@contextmanager
def looped_by(scores: Scores | None) -> Iterator[None]:
    """Within: the decoders this module covers run teacher forcing as one operation whose scores are `scores`'s
    (None: the step-by-step loop)."""
    token = _SCORES.set(scores)
    try:
        yield
    finally:
        _SCORES.reset(token)


def loop_scores() -> Scores | None:
    """The `Scores` of the enclosing `looped_by`, or None."""
    return _SCORES.get()


class AdditiveGRULoop(torch.autograd.Function):
    """The loop above: (s_0 .. s_{T-1}) (B, T, H) and (c_1 .. c_T) (B, T, H) from the hoisted gate inputs."""

    @staticmethod
    def forward(
        ctx,
        pre: torch.Tensor,  # (B, T, G): W_ih^E E y_{i-1} + b_ih
        h0: torch.Tensor,  # (B, H) s_0
        keys: torch.Tensor,  # (B, S, A) U_a h_j
        memory: torch.Tensor,  # (B, S, H) h_j
        mask: torch.Tensor,  # (B, S) bool, True = real token
        w_a: torch.Tensor,  # (A, H)
        w_hh: torch.Tensor,  # (G, H)
        b_hh: torch.Tensor,  # (G,)
        v: torch.Tensor,  # (A,)
        w_c: torch.Tensor,  # (G, H) W_ih^C
        scores: Scores,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        device = pre.device.type
        cdt = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else pre.dtype  # the products'
        with torch.autocast(device, enabled=False):
            (B, T, G), (A, H), S = pre.shape, w_a.shape, keys.size(1)
            w_qh = torch.cat([w_a, w_hh]).to(cdt)  # (A + G, H): the query and the GRU's W_hh s in one product
            b_qh = torch.cat([b_hh.new_zeros(A), b_hh]).to(cdt)
            w_cc, keys_c, pre_c = w_c.to(cdt), keys.to(cdt).contiguous(), pre.to(cdt)
            acc = torch.promote_types(memory.dtype, torch.float32)  # softmax, contexts and state
            states = pre.new_empty(B, T, H, dtype=h0.dtype)  # s_{i-1}
            contexts = memory.new_empty(B, T, H)
            weights = memory.new_empty(B, T, S, dtype=acc)
            products = pre_c.new_empty(B, T, A + G)  # [W_a; W_hh] s_{i-1} + [0; b_hh]
            gates = pre_c.new_empty(B, T, 3, H)  # r, z, n
            blocked, h = ~mask, h0
            for t in range(T):
                states[:, t] = h
                qg = torch.addmm(b_qh, h.to(cdt), w_qh.t())  # (B, A + G)
                products[:, t] = qg
                e = scores.forward(qg[:, :A], keys_c, v).to(acc).masked_fill_(blocked, float("-inf"))  # (B, S)
                a = torch.softmax(e, -1)  # (B, S)
                weights[:, t] = a
                c = torch.bmm(a[:, None, :].to(memory.dtype), memory)[:, 0]  # (B, H)
                contexts[:, t] = c
                x_r, x_z, x_n = torch.addmm(pre_c[:, t], c.to(cdt), w_cc.t()).unsafe_chunk(3, 1)  # (B, H) each
                h_r, h_z, h_n = qg[:, A:].unsafe_chunk(3, 1)
                r = torch.sigmoid(x_r + h_r)
                z = torch.sigmoid(x_z + h_z)
                n = torch.tanh(x_n + r * h_n)
                gates[:, t, 0], gates[:, t, 1], gates[:, t, 2] = r, z, n
                h = (h - n).mul_(z).add_(n)  # s_i = (1 - z) n + z s_{i-1}
        ctx.save_for_backward(states, contexts, weights, products, gates, keys_c, memory, w_qh, w_cc, v)
        ctx.scores, ctx.dtypes = scores, (pre.dtype, keys.dtype, v.dtype)
        return states, contexts

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, d_states: torch.Tensor | None, d_contexts: torch.Tensor | None) -> tuple:
        states, contexts, weights, products, gates, keys, memory, w_qh, w_cc, v = ctx.saved_tensors
        (B, T, H), S, A = states.shape, keys.size(1), w_qh.size(0) - 3 * states.size(2)
        cdt, acc = w_qh.dtype, torch.promote_types(states.dtype, torch.float32)
        with torch.autocast(states.device.type, enabled=False):
            d_states = states.new_zeros(B, T, H, dtype=acc) if d_states is None else d_states.to(acc)
            d_contexts = states.new_zeros(B, T, H, dtype=acc) if d_contexts is None else d_contexts.to(acc)
            dh = states.new_zeros(B, H, dtype=acc)  # dL/ds_{i}, carried back a step at a time
            d_gates = states.new_empty(B, T, 3 * H, dtype=acc)  # the GRU input's gates: dL/d(pre) and W_ih^C's
            d_products = states.new_empty(B, T, A + 3 * H, dtype=acc)  # dL/d([W_a; W_hh] s_{i-1} + [0; b_hh])
            d_c = states.new_empty(B, T, H, dtype=acc)  # dL/dc_i, all paths
            d_keys = states.new_zeros(B, S, A, dtype=acc)
            dv_rows = states.new_zeros(B, A, dtype=acc)
            for t in range(T - 1, -1, -1):
                r, z, n = gates[:, t].to(acc).unbind(1)
                h_n = products[:, t, A + 2 * H :].to(acc)
                dn = dh * (1 - z) * (1 - n * n)  # through n = tanh(x_n + r h_n)
                dr = dn * h_n * r * (1 - r)
                dz = dh * (states[:, t].to(acc) - n) * z * (1 - z)
                dg = d_gates[:, t]
                dg[:, :H], dg[:, H : 2 * H], dg[:, 2 * H :] = dr, dz, dn
                dq = d_products[:, t]
                dq[:, A : A + 2 * H], dq[:, A + 2 * H :] = dg[:, : 2 * H], dn * r
                dc = torch.mm(dg.to(cdt), w_cc).to(acc).add_(d_contexts[:, t])  # (B, H)
                d_c[:, t] = dc
                a = weights[:, t]
                da = torch.bmm(memory, dc[:, :, None].to(memory.dtype))[:, :, 0].to(acc)  # (B, S)
                de = a * (da - (a * da).sum(-1, keepdim=True))  # softmax's backward; 0 on padding
                dq[:, :A] = ctx.scores.backward(products[:, t, :A], keys, v, de, d_keys, dv_rows)
                dh = (dh * z).add_(d_states[:, t]).add_(torch.mm(dq.to(cdt), w_qh).to(acc))
            d_w_qh = torch.mm(d_products.view(-1, A + 3 * H).t().to(cdt), states.view(-1, H).to(cdt)).to(acc)
            d_w_c = torch.mm(d_gates.view(-1, 3 * H).t().to(cdt), contexts.view(-1, H).to(cdt)).to(acc)
            d_memory = torch.bmm(weights.transpose(1, 2).to(memory.dtype), d_c.to(memory.dtype))  # (B, S, H)
        pre_dtype, keys_dtype, v_dtype = ctx.dtypes
        return (
            d_gates.to(pre_dtype),
            dh.to(states.dtype),
            d_keys.to(keys_dtype),
            d_memory,
            None,
            d_w_qh[:A],
            d_w_qh[A:],
            d_products[:, :, A:].sum((0, 1)),
            dv_rows.sum(0).to(v_dtype),
            d_w_c,
            None,
        )


def fused_features(decoder, tgt_in: torch.Tensor, enc: dict, scores: Scores) -> torch.Tensor:
    """BahdanauDecoder.features under teacher forcing (a GRU of one layer, the additive score) as the loop above:
    the output layer's input (B, T, E)."""
    enc = decoder.prepare(enc)
    emb = decoder.dropout(decoder.embed(tgt_in))  # (B, T, E)
    (B, T, E), rnn, attention = emb.shape, decoder.rnn.rnn, decoder.attention
    w_ih = rnn.weight_ih_l0  # (G, E + H): [W_ih^E W_ih^C]
    pre = F.linear(emb, w_ih[:, :E], rnn.bias_ih_l0)  # (B, T, G)
    states, contexts = AdditiveGRULoop.apply(
        pre, enc["init_h"][:, -1], enc["keys"], enc["memory"], enc["src_mask"], attention.W_a.weight,
        rnn.weight_hh_l0, rnn.bias_hh_l0, attention.v_a.weight[0], w_ih[:, E:], scores,
    )  # fmt: skip
    t_tilde = decoder.readout(torch.cat([states, emb, contexts], -1))  # (B, T, 2E)
    return decoder.dropout(t_tilde.view(B, T, -1, 2).amax(-1))  # (B, T, E) maxout
