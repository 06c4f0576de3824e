"""Dropout by nmt's C kernel (nmt/training/native_dropout.py, csrc/dropout.c): the rate asked for in every lane and
block, the expectation kept, the gradient through the same mask (drawn again, never stored), the same output on any
thread count, resumable from torch's generator; and bf16 training with it learns as with torch's masks."""

from __future__ import annotations

import statistics

import pytest
import torch

from nmt.cli.common import compose
from nmt.engine import native
from nmt.models import transformer
from nmt.models.dropout import Dropout, drawn_by, dropout
from nmt.training.native_dropout import native_dropout, resolve_dropout_kernel
from nmt.training.native_norm import native_norm, resolve_norm_kernel
from nmt.training.trainer import Trainer
from tests.test_training_numerics import corpus, overrides  # noqa: F401 (the toy corpus fixture)

built = pytest.mark.skipif(native.library() is None, reason="no C compiler here: dropout falls back to torch's")


@built
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("p", [0.1, 0.3, 0.5])
def test_elements_are_dropped_at_the_rate_asked_for_and_the_mean_is_kept(p, dtype):
    torch.manual_seed(0)
    x = torch.ones(1000, 1001, dtype=dtype)  # an odd count: the last block of 64 and the last word are cut
    y = native_dropout(x, p)
    assert y.dtype == dtype and y.shape == x.shape
    dropped = float((y == 0).float().mean())
    assert dropped == pytest.approx(p, abs=0.003)  # 1M draws: standard error under 0.0005
    assert float(y.float().mean()) == pytest.approx(1.0, abs=0.01)
    kept = y[y != 0].float().unique()
    tolerance = 1e-2 if dtype is torch.bfloat16 else 1e-4
    assert kept.numel() == 1 and float(kept) == pytest.approx(1 / (1 - p), rel=tolerance)


@built
def test_every_lane_and_neighbour_is_an_independent_draw():
    """Each of the four 16-bit lanes of a word and each position of a 64-element block drops at the rate asked for,
    and two neighbours are both dropped at p squared (no correlation between lanes or words)."""
    torch.manual_seed(1)
    y = native_dropout(torch.ones(64 * 20_000), 0.5)
    dropped = y == 0
    assert torch.allclose(dropped.view(-1, 4).float().mean(0), torch.full((4,), 0.5), atol=0.006)
    assert torch.allclose(dropped.view(-1, 64).float().mean(0), torch.full((64,), 0.5), atol=0.012)
    both = float((dropped[1:] & dropped[:-1]).float().mean())
    assert both == pytest.approx(0.25, abs=0.004)


@built
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kept_values_are_the_input_scaled_and_rounded_once(dtype):
    torch.manual_seed(2)
    x = torch.randn(37, 129).to(dtype)
    y = native_dropout(x, 0.25)
    kept = y != 0
    scale = torch.tensor(65536 / (65536 - 16384), dtype=torch.float32)  # 1 / keep rate, in float32 as the kernel's
    expected = (x.float() * (kept * scale)).to(dtype)
    assert torch.equal(y, expected)


@built
def test_the_gradient_goes_through_the_same_mask_scaled():
    torch.manual_seed(3)
    x = torch.randn(64, 33, requires_grad=True)
    y = native_dropout(x, 0.25)
    (y * torch.arange(y.numel()).view_as(y)).sum().backward()  # a gradient that differs per element
    kept = (y.detach() != 0).float()
    torch.testing.assert_close(x.grad, kept * torch.arange(y.numel()).view_as(y) / 0.75, rtol=1e-6, atol=0)


@built
def test_a_bf16_gradient_flows_back_in_bf16_and_an_expanded_one_is_made_contiguous():
    torch.manual_seed(4)
    x = torch.randn(16, 70, dtype=torch.bfloat16, requires_grad=True)
    y = native_dropout(x, 0.3)
    y.sum().backward()  # the gradient of a sum arrives expanded (stride 0)
    scale = torch.tensor(65536 / (65536 - round(0.3 * 65536)), dtype=torch.float32)
    assert x.grad.dtype == torch.bfloat16
    assert torch.equal(x.grad, ((y.detach() != 0) * scale).to(torch.bfloat16))  # x has no zeros: kept = nonzero


@built
def test_the_mask_follows_the_default_generator_and_not_the_thread_count():
    """Exact resume restores torch's RNG state: the same state gives the same mask, on 1 or 2 threads."""
    threads = torch.get_num_threads()
    outputs = []
    try:
        for n in (1, 2, 1):
            torch.set_num_threads(n)
            torch.manual_seed(5)
            outputs.append(native_dropout(torch.ones(300, 1000), 0.2))  # large enough to be shared among threads
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(outputs[0], outputs[1]) and torch.equal(outputs[0], outputs[2])
    torch.manual_seed(6)
    assert not torch.equal(native_dropout(torch.ones(300, 1000), 0.2), outputs[0])


@built
def test_it_runs_under_the_profiler_recording_shapes():
    """torch.profiler(record_shapes=True) converts every argument of an autograd Function to a C++ int64: a seed of
    2**63 or more crossing `apply` would fail there (every seed is drawn here until one has its top bit set)."""
    x = torch.randn(8, 8, requires_grad=True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True):
        for seed in range(8):
            torch.manual_seed(seed)
            native_dropout(x, 0.5).sum().backward()
    assert x.grad is not None


@built
def test_drawn_by_routes_training_dropout_only():
    x = torch.ones(50, 50)
    with drawn_by(native_dropout):
        torch.manual_seed(7)
        routed = Dropout(0.3)(x)
        assert Dropout(0.3).eval()(x) is x and dropout(x, 0.0) is x
    torch.manual_seed(7)
    assert torch.equal(routed, native_dropout(x, 0.3))
    torch.manual_seed(7)
    assert not torch.equal(dropout(x, 0.3), routed)  # outside: torch's masks again


@pytest.mark.parametrize(
    ("what", "resolve", "kernel"),
    [("dropout", resolve_dropout_kernel, native_dropout), ("norm", resolve_norm_kernel, native_norm)],
)
def test_the_training_kernel_choice(what, resolve, kernel):
    """train.dropout_kernel and train.norm_kernel: auto is native for bf16 training on a CPU (where the kernels are
    built), torch's in fp32 (the study's numbers); native elsewhere falls back to torch's; an unknown name fails."""
    cpu = torch.device("cpu")
    built_kernel = kernel if native.library() is not None else None
    assert resolve("auto", "bf16", cpu) is built_kernel
    assert resolve("auto", "fp32", cpu) is None
    assert resolve("native", "fp32", cpu) is built_kernel
    assert resolve("native", "bf16", torch.device("meta")) is None
    assert resolve("torch", "bf16", cpu) is None
    with pytest.raises(ValueError, match=f"{what} kernel 'fast'"):
        resolve("fast", "bf16", cpu)


STEPS, WINDOW = 240, 40


def bf16_losses(corpus, tmp_path, name: str, settings: list[str], model: str = "transformer") -> list[float]:  # noqa: F811
    """The losses of a toy model's 240 bf16 updates with these settings, one per update (tests/test_training_numerics'
    MODELS: a Transformer by default)."""
    config = [o for o in overrides(corpus, model) if not o.startswith("train.max_steps")]
    config += [f"train.max_steps={STEPS}", "train.precision=bf16", *settings]
    trainer = Trainer(compose("config", config), tmp_path / name)
    losses: list[float] = []
    step = trainer.train_step
    trainer.train_step = lambda *a, **k: losses.append(step(*a, **k)) or losses[-1]
    trainer.fit()
    return losses


@built
def test_bf16_training_learns_as_before_the_kernel_and_joint_projections(corpus, tmp_path, monkeypatch):  # noqa: F811
    """A toy Transformer (dropout 0.3) trained 240 bf16 updates as now (the C dropout, W^Q W^K W^V as one product)
    and as before (torch's masks, three products): other masks, so other losses update by update, but the same
    curve: every window of 40 updates has a mean loss within 0.05 of the other's (measured: within 0.013; the loss
    falls by ~1 over the run), and both fall."""
    ours = bf16_losses(corpus, tmp_path, "native", ["train.dropout_kernel=native", "model.dropout=0.3"])
    monkeypatch.setattr(transformer, "project", lambda x, *linears: tuple(linear(x) for linear in linears))
    theirs = bf16_losses(corpus, tmp_path, "torch", ["train.dropout_kernel=torch", "model.dropout=0.3"])
    assert None not in ours and None not in theirs and ours != theirs
    means = [
        (statistics.fmean(a[i : i + WINDOW]), statistics.fmean(b[i : i + WINDOW]))
        for a, b in [(ours, theirs)]
        for i in range(0, STEPS, WINDOW)
    ]
    assert all(abs(a - b) < 0.05 for a, b in means), means
    assert means[-1][0] < means[0][0] - 0.5 and means[-1][1] < means[0][1] - 0.5, means
