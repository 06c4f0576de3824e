"""Layer normalization by nmt's C kernel for bf16 training (nmt/training/native_norm.py, csrc/layernorm.c): torch's
LayerNorm rounded to bf16 once, its gradients within float32 rounding of autograd's through torch's LayerNorm and
cast, the same bits on any thread count, used only where bf16 products read the output, and bf16 training with it
learning as with torch's."""

from __future__ import annotations

import statistics

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from nmt.engine import native
from nmt.models.norm import InputNorm, normed_by
from nmt.models.transformer import build_transformer
from nmt.training.native_norm import native_norm
from tests.test_native_dropout import STEPS, WINDOW, bf16_losses
from tests.test_training_numerics import corpus  # noqa: F401 (the toy corpus fixture)

built = pytest.mark.skipif(native.library() is None, reason="no C compiler here: LayerNorm stays torch's")
bf16 = torch.autocast("cpu", dtype=torch.bfloat16)


def torch_reference(x, weight, bias, grad):
    """Autograd through what bf16 training computes without the kernel: LayerNorm in fp32, then the cast."""
    x, weight, bias = (t.detach().clone().requires_grad_() for t in (x, weight, bias))
    y = F.layer_norm(x, x.shape[-1:], weight, bias, 1e-5).to(torch.bfloat16)
    y.backward(grad)
    return y, x.grad, weight.grad, bias.grad


@built
@pytest.mark.parametrize("shape", [(3, 5, 256), (1, 1, 7), (130, 33), (2, 70, 17), (0, 8)])
@pytest.mark.parametrize("grad_dtype", [torch.bfloat16, torch.float32])
def test_it_equals_torch_layer_norm_then_the_cast_within_rounding(shape, grad_dtype):
    """Odd widths (the 16-lane sums' remainders), more rows than a block of 64 (several partial sums for the
    weight's gradient), an empty batch; the output's gradient in bf16 (from a bf16 product) or fp32."""
    torch.manual_seed(0)
    width = shape[-1]
    x = (torch.randn(shape) * 3 + 1).requires_grad_()
    weight, bias = torch.randn(width).requires_grad_(), torch.randn(width).requires_grad_()
    grad = torch.randn(shape).to(grad_dtype)
    with bf16:
        y = native_norm(x, weight, bias, 1e-5)
    assert y.dtype == torch.bfloat16 and y.shape == x.shape
    y.backward(grad)
    ref_y, ref_dx, ref_dw, ref_db = torch_reference(x, weight, bias, grad)
    differ = (y != ref_y).float().mean() if y.numel() else 0.0
    assert differ <= 1e-3  # float32 sums in another order: a value on a bf16 rounding boundary may go the other way
    torch.testing.assert_close(y.float(), ref_y.float(), rtol=2**-7, atol=0)  # and then by one bf16 step at most
    for ours, ref in ((x.grad, ref_dx), (weight.grad, ref_dw), (bias.grad, ref_db)):
        assert ours.dtype == torch.float32
        torch.testing.assert_close(
            ours, ref, rtol=1e-5, atol=1e-5 * max(1.0, float(ref.abs().amax()) if ref.numel() else 1.0)
        )


@built
def test_the_same_bits_on_one_thread_or_two():
    """Rows are shared among threads and the weight's gradient summed in blocks of 64 rows added in order."""
    torch.manual_seed(1)
    x, weight, bias = torch.randn(3000, 256), torch.randn(256), torch.randn(256)
    grad = torch.randn(3000, 256).to(torch.bfloat16)
    threads, results = torch.get_num_threads(), []
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            y, mean, rstd = native.layer_norm_bf16_forward(x, weight, bias, 1e-5)
            results.append((y, *native.layer_norm_bf16_backward(x, grad, weight, mean, rstd)))
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(a, b) for a, b in zip(*results))


@built
def test_the_kernel_refuses_what_it_cannot_read_in_one_line():
    x, weight = torch.randn(4, 8), torch.randn(8)
    with pytest.raises(ValueError, match=r"native.layer_norm_bf16_forward: bias: 7 values for rows of 8"):
        native.layer_norm_bf16_forward(x, weight, torch.randn(7), 1e-5)
    with pytest.raises(ValueError, match="x must be a CPU float32 tensor of 2 dimensions, contiguous"):
        native.layer_norm_bf16_forward(x.t(), weight, weight, 1e-5)
    y, mean, rstd = native.layer_norm_bf16_forward(x, weight, weight, 1e-5)
    with pytest.raises(ValueError, match=r"grad \(4, 7\): expected the shape of x, \(4, 8\)"):
        native.layer_norm_bf16_backward(x, torch.randn(4, 7), weight, mean, rstd)


@built
def test_outside_bf16_autocast_it_is_torch_layer_norm_exactly():
    """fp32 training (the study's), decoding, and an input that is not fp32 get torch's LayerNorm bit for bit."""
    torch.manual_seed(2)
    x, weight, bias = torch.randn(6, 32), torch.randn(32), torch.randn(32)
    assert torch.equal(native_norm(x, weight, bias, 1e-5), F.layer_norm(x, (32,), weight, bias, 1e-5))
    with bf16:
        half = x.to(torch.bfloat16)
        assert torch.equal(native_norm(half, weight, bias, 1e-5), F.layer_norm(half, (32,), weight, bias, 1e-5))


def tiny(norm: str = "pre"):
    return build_transformer(20, 20, False, dim=16, layers=2, heads=2, ffn_dim=32, dropout=0.0, norm=norm,
                             scale=True, tie_output=False)  # fmt: skip


@built
def test_normed_by_routes_the_input_norms_only():
    """Within normed_by, a pre-norm Transformer's sub-layer norms and final norms go to the kernel and a post-norm's
    (its output is the residual stream) never do; outside, they are nn.LayerNorm's."""
    calls: list[int] = []

    def kernel(x, weight, bias, eps):
        calls.append(x.size(-1))
        return F.layer_norm(x, x.shape[-1:], weight, bias, eps)

    counts = {}
    for norm in ("pre", "post"):
        torch.manual_seed(3)
        model = tiny(norm)
        src, tgt = torch.randint(4, 20, (2, 5)), torch.randint(4, 20, (2, 6))
        mask = torch.ones(2, 5, dtype=torch.bool)
        plain = model(src, mask, tgt)
        calls.clear()
        with normed_by(kernel):
            routed = model(src, mask, tgt)
        counts[norm] = len(calls)
        torch.testing.assert_close(routed, plain, rtol=0, atol=0)
    assert counts == {"pre": 2 * 2 + 2 * 3 + 2, "post": 0}  # encoder 2 per layer, decoder 3, and the 2 final norms
    kinds = {norm: {type(m) for m in tiny(norm).modules() if isinstance(m, nn.LayerNorm)} for norm in ("pre", "post")}
    assert kinds == {"pre": {InputNorm}, "post": {nn.LayerNorm}}


@built
def test_bf16_training_learns_as_with_torch_layer_norm(corpus, tmp_path):  # noqa: F811
    """A toy Transformer trained 240 bf16 updates with the kernel and with torch's LayerNorm: the same masks and
    batches, so the runs part only by rounding; every window of 40 updates has a mean loss within 0.005 of the
    other's (measured: within 0.0001; the loss falls by ~1 over the run), and both fall."""
    same_masks = "train.dropout_kernel=torch"  # the same masks in both runs: only the norm differs
    ours = bf16_losses(corpus, tmp_path, "native", ["train.norm_kernel=native", same_masks])
    theirs = bf16_losses(corpus, tmp_path, "torch", ["train.norm_kernel=torch", same_masks])
    assert None not in ours and None not in theirs and ours != theirs  # the kernel did run
    means = [
        (statistics.fmean(ours[i : i + WINDOW]), statistics.fmean(theirs[i : i + WINDOW]))
        for i in range(0, STEPS, WINDOW)
    ]
    assert all(abs(a - b) < 0.005 for a, b in means), means
    assert means[-1][0] < means[0][0] - 0.5 and means[-1][1] < means[0][1] - 0.5, means
