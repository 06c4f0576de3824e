"""The CPU dropout of nmt/models/dropout.py: the rate asked for, the expectation kept,
the gradient through the same mask."""

import pytest
import torch

from nmt.models.dropout import Dropout, dropout, keep_mask


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5])
def test_elements_are_dropped_at_the_rate_asked_for_and_the_mean_is_kept(p):
    torch.manual_seed(0)
    x = torch.ones(1000, 1001)  # an odd count: the last 64-bit word is cut
    y = dropout(x, p)
    dropped = float((y == 0).float().mean())
    assert dropped == pytest.approx(p, abs=0.003)  # 1M Bernoulli draws: standard error under 0.0005
    assert float(y.mean()) == pytest.approx(1.0, abs=0.005)
    values = y.unique().tolist()
    assert len(values) == 2 and values[0] == 0.0 and values[1] == pytest.approx(1 / (1 - p), rel=1e-4)


def test_every_position_of_the_mask_is_uniform():
    """Each of the four 16-bit lanes of a 64-bit word drops at the same rate (no lane is biased)."""
    torch.manual_seed(1)
    keep, _ = keep_mask(torch.Size([400_000]), 0.5, torch.device("cpu"))
    lanes = keep.view(-1, 4).float().mean(0)
    assert torch.allclose(lanes, torch.full((4,), 0.5), atol=0.006)


def test_the_gradient_goes_through_the_kept_elements_scaled():
    torch.manual_seed(2)
    x = torch.randn(64, 33, requires_grad=True)
    y = dropout(x, 0.25)
    y.sum().backward()
    kept = y.detach() != 0
    torch.testing.assert_close(x.grad, kept.float() / 0.75)


def test_dropout_is_the_identity_in_eval_mode_and_at_rate_zero():
    x = torch.randn(5, 7)
    module = Dropout(0.4).eval()
    assert module(x) is x
    assert dropout(x, 0.0) is x
    assert torch.equal(dropout(x, 1.0), torch.zeros_like(x))


def test_a_bf16_input_stays_bf16():
    x = torch.randn(8, 8).to(torch.bfloat16)
    assert dropout(x, 0.1).dtype == torch.bfloat16


def test_the_mask_follows_the_default_generator():
    """Exact resume restores torch's RNG state: the same state gives the same mask."""
    torch.manual_seed(3)
    a = dropout(torch.ones(100, 100), 0.2)
    torch.manual_seed(3)
    b = dropout(torch.ones(100, 100), 0.2)
    assert torch.equal(a, b)
