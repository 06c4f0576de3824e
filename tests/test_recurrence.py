"""The packed recurrence of nmt.models.recurrence equals torch's nn.GRU / nn.LSTM over a PackedSequence bit for bit:
outputs, final states and every gradient, in training (dropout between layers included) and under bf16 autocast."""

import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence

from nmt.models.recurrence import packed_rnn

LENGTHS = [7, 3, 9, 1, 9, 5]  # unsorted, with a tie and a one-token sentence


def outputs_and_gradients(rnn, x, use_packed_rnn, autocast=False):
    x = x.clone().requires_grad_()
    rnn.zero_grad(set_to_none=True)
    torch.manual_seed(7)  # the same dropout masks for both
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        packed = pack_padded_sequence(x, torch.tensor(LENGTHS), batch_first=True, enforce_sorted=False)
        out, final = packed_rnn(rnn, packed) if use_packed_rnn else rnn(packed)
    finals = final if isinstance(final, tuple) else (final,)
    weights = torch.linspace(-1, 1, out.data.numel()).view_as(out.data)
    loss = (out.data * weights).sum() + sum((f * (k + 0.5)).sum() for k, f in enumerate(finals))
    loss.backward()
    return [out.data, *finals, x.grad, *(p.grad for p in rnn.parameters())]


@pytest.mark.parametrize("cell", [nn.GRU, nn.LSTM])
@pytest.mark.parametrize("layers, bidirectional", [(1, True), (2, True), (2, False)])
@pytest.mark.parametrize("autocast", [False, True])
def test_packed_rnn_equals_torch_bit_for_bit(cell, layers, bidirectional, autocast):
    torch.manual_seed(0)
    rnn = cell(5, 4, layers, batch_first=True, bidirectional=bidirectional, dropout=0.3 if layers > 1 else 0.0)
    x = torch.randn(len(LENGTHS), max(LENGTHS), 5)
    ours, torchs = (outputs_and_gradients(rnn, x, flag, autocast) for flag in (True, False))
    assert len(ours) == len(torchs)
    for a, b in zip(ours, torchs):
        assert a.dtype == b.dtype == torch.float32 and torch.equal(a, b)


def test_in_evaluation_there_is_no_dropout_and_the_states_follow_the_batch_order():
    torch.manual_seed(1)
    rnn = nn.GRU(3, 2, 2, batch_first=True, bidirectional=True, dropout=0.5).eval()
    x = torch.randn(len(LENGTHS), max(LENGTHS), 3)
    packed = pack_padded_sequence(x, torch.tensor(LENGTHS), batch_first=True, enforce_sorted=False)
    with torch.no_grad():
        (out, h), (ref_out, ref_h) = packed_rnn(rnn, packed), rnn(packed)
    assert torch.equal(out.data, ref_out.data) and torch.equal(h, ref_h)
    # the third sentence alone gives its own final states
    alone = pack_padded_sequence(x[2:3], torch.tensor(LENGTHS[2:3]), batch_first=True)
    with torch.no_grad():
        _, h_alone = packed_rnn(rnn, alone)
    torch.testing.assert_close(h_alone[:, 0], h[:, 2])
