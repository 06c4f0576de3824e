"""A stacked (bi)directional GRU / LSTM over a packed batch, computed as torch's CPU kernels compute it, with one
backward pass per layer's input instead of one per time step.

torch's CPU recurrence over a PackedSequence (aten's PackedLayer and ReversedPackedLayer) projects the whole
input once, W_ih x + b_ih for every position, then reads each step's rows of it with `narrow`. In the backward
pass every one of those views makes a zero tensor the size of the whole projection and adds its step's gradient
into it: S zero-fills and S additions of (N, 3H) or (N, 4H) per direction and layer. `packed_rnn` runs the same
operations in the same order (the same cells, written as aten writes them, the same in-place steps, the same
dropout between layers), so its outputs and gradients equal nn.GRU's / nn.LSTM's bit for bit, but splits the
projection into its steps with one `split`, whose backward joins the step gradients once. Under autocast its
products are cast as torch's are (the cells' F.linear), so it equals torch there too. Training uses it; inference,
with no backward pass, keeps torch's C++ loop.

    GRU  (aten's GRUCell):  r = sigmoid(W_hr h + b_hr + x_r)     x = W_ih x_t + b_ih, precomputed
                            z = sigmoid(W_hz h + b_hz + x_z)
                            n = tanh(x_n + r * (W_hn h + b_hn))
                            h' = (h - n) * z + n
    LSTM (aten's LSTMCell): i, f, g, o = chunks of W_hh h + b_hh + x;  c' = sigmoid(f) c + sigmoid(i) tanh(g)
                            h' = sigmoid(o) tanh(c')

Shape legend: N packed positions (the real tokens of the batch), B batch, I input, H hidden per direction,
L layers, D directions, G gates (3 GRU, 4 LSTM).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import PackedSequence

State = tuple[torch.Tensor, ...]  # (h,) for a GRU, (h, c) for an LSTM: (B, H) each


def gru_cell(gates_in: torch.Tensor, state: State, w_hh: torch.Tensor, b_hh: torch.Tensor) -> State:
    """One GRU step from the precomputed input gates (B, 3H) and (h,) (B, H), as aten's GRUCell computes it."""
    (h,) = state
    x_r, x_z, x_n = gates_in.unsafe_chunk(3, 1)
    h_r, h_z, h_n = F.linear(h, w_hh, b_hh).unsafe_chunk(3, 1)
    reset = h_r.add_(x_r).sigmoid_()
    update = h_z.add_(x_z).sigmoid_()
    new = x_n.add(h_n.mul_(reset)).tanh_()
    return ((h - new).mul_(update).add_(new),)


def lstm_cell(gates_in: torch.Tensor, state: State, w_hh: torch.Tensor, b_hh: torch.Tensor) -> State:
    """One LSTM step from the precomputed input gates (B, 4H) and (h, c) (B, H), as aten's LSTMCell computes it."""
    h, c = state
    i, f, g, o = F.linear(h, w_hh, b_hh).add_(gates_in).unsafe_chunk(4, 1)
    c_new = (f.sigmoid_() * c).add_(i.sigmoid_() * g.tanh_())
    return o.sigmoid_() * c_new.tanh(), c_new


def direction(
    data: torch.Tensor, sizes: list[int], weights: list[torch.Tensor], lstm: bool, reverse: bool
) -> tuple[torch.Tensor, State]:
    """One direction of one layer over packed data (N, I), batch sizes per step `sizes` (longest sentence first):
    outputs (N, H) and the final state in the packed (sorted) order, (B, H) each."""
    w_ih, w_hh, b_ih, b_hh = weights
    steps = F.linear(data, w_ih, b_ih).split(sizes)  # (n_t, G * H) per step: one backward for all
    cell, parts = (lstm_cell, 2) if lstm else (gru_cell, 1)

    def zeros(rows: int) -> State:
        return tuple(data.new_zeros(rows, w_hh.size(1)) for _ in range(parts))

    outputs: list[torch.Tensor] = [data] * len(steps)
    if not reverse:  # the batch shrinks as sentences end: their last states are kept aside
        state, ended = zeros(sizes[0]), []
        for t, gates in enumerate(steps):
            if state[0].size(0) > sizes[t]:
                ended.append(tuple(x[sizes[t] :] for x in state))
                state = tuple(x[: sizes[t]] for x in state)
            state = cell(gates, state, w_hh, b_hh)
            outputs[t] = state[0]
        final = tuple(torch.cat([x, *(e[k] for e in reversed(ended))], 0) for k, x in enumerate(state))
    else:  # from the end: the batch grows as sentences start, from zero states
        state = zeros(sizes[-1])
        for t in range(len(steps) - 1, -1, -1):
            if sizes[t] > state[0].size(0):
                state = tuple(torch.cat([x, z], 0) for x, z in zip(state, zeros(sizes[t] - state[0].size(0))))
            state = cell(steps[t], state, w_hh, b_hh)
            outputs[t] = state[0]
        final = state
    return torch.cat(outputs, 0), final


def packed_rnn(rnn: nn.GRU | nn.LSTM, packed: PackedSequence) -> tuple[PackedSequence, torch.Tensor | State]:
    """rnn(packed) from zero initial states, for an nn.GRU / nn.LSTM without projections: the packed outputs and the
    final state, h (L * D, B, H) for a GRU and (h, c) for an LSTM, in the batch's own order, as the module returns
    them (a GRU's h alone, an LSTM's as a tuple)."""
    lstm, directions = isinstance(rnn, nn.LSTM), 2 if rnn.bidirectional else 1
    sizes = packed.batch_sizes.tolist()
    data, finals = packed.data, []
    for layer in range(rnn.num_layers):
        outs = []
        for d in range(directions):
            suffix = f"_l{layer}" + ("_reverse" if d else "")
            names = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
            out, final = direction(data, sizes, [getattr(rnn, n + suffix) for n in names], lstm, reverse=d == 1)
            outs.append(out)
            finals.append(final)
        data = torch.cat(outs, 1) if directions > 1 else outs[0]  # (N, D * H)
        if rnn.dropout and rnn.training and layer < rnn.num_layers - 1:
            data = F.dropout(data, rnn.dropout, True)
    order = packed.unsorted_indices
    state = tuple(torch.stack([f[k] for f in finals]) for k in range(len(finals[0])))  # (L * D, B, H) each
    if order is not None:
        state = tuple(x[:, order] for x in state)
    out = PackedSequence(data, packed.batch_sizes, packed.sorted_indices, packed.unsorted_indices)
    return out, (state if lstm else state[0])
