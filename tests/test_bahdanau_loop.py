"""Bahdanau's teacher forcing as one operation (`train.decoder_loop`, nmt/models/bahdanau_loop.py) and its additive
score in C (nmt/training/native_attention.py, csrc/additive.c): the same features and gradients as the step-by-step
loop, the kernel equal to torch's score within float32 rounding, the fallbacks, and a bf16 loss curve."""

from __future__ import annotations

import copy
import statistics

import pytest
import torch

from nmt.config import ModelConfig
from nmt.engine import native
from nmt.models.bahdanau_loop import TorchScores, looped_by
from nmt.models.builders import build_model
from nmt.training.native_attention import NativeScores, resolve_decoder_loop
from tests.test_native_dropout import STEPS, WINDOW, bf16_losses
from tests.test_training_numerics import corpus  # noqa: F401 (the toy corpus fixture)

built = pytest.mark.skipif(native.library() is None, reason="no C compiler here: the score falls back to torch's")


def toy(**settings) -> torch.nn.Module:
    torch.manual_seed(0)
    config = {"arch": "bahdanau", "cell": "gru", "dim": 32, "embed_dim": 16, "layers": 1, "score": "additive"}
    return build_model(ModelConfig(**{**config, "dropout": 0.0, **settings}), 50, 50, False).train()


def batch(B: int = 5, S: int = 7, T: int = 6) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sources with padding (sentences of 7, 4, 7, 2, 7 tokens), targets (B, T)."""
    g = torch.Generator().manual_seed(1)
    src, tgt = torch.randint(4, 50, (B, S), generator=g), torch.randint(4, 50, (B, T), generator=g)
    mask = torch.ones(B, S, dtype=torch.bool)
    mask[1, 4:], mask[3, 2:] = False, False
    return src.masked_fill(~mask, 0), mask, tgt


def run(model, scores, autocast: bool = False) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Teacher-forced features within looped_by(scores) and every parameter's gradient of a fixed weighting of them."""
    src, mask, tgt = batch()
    model.zero_grad()
    torch.manual_seed(2)  # the same draws (hard attention's samples) in every run
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast), looped_by(scores):
        features, _ = model.decoder.features(tgt, model.encoder(src, mask))
    weights = torch.linspace(-1, 1, features.numel(), dtype=features.dtype).view_as(features)
    (features.float() * weights.float()).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return features.detach(), grads


def test_one_operation_equals_the_step_by_step_loop_in_float64():
    """Every feature and every parameter's gradient (encoder, attention, GRU, readout) as the recorded loop gives
    them, to float64 rounding, with padded sources."""
    model = toy().double()
    steps, fused = run(model, None), run(model, TorchScores())
    torch.testing.assert_close(fused[0], steps[0], rtol=1e-12, atol=1e-12)
    assert fused[1].keys() == steps[1].keys() and len(steps[1]) == 22
    for name in steps[1]:
        torch.testing.assert_close(fused[1][name], steps[1][name], rtol=1e-10, atol=1e-12, msg=name)


@pytest.mark.parametrize("scores", [TorchScores(), pytest.param(NativeScores(), marks=built)], ids=["torch", "native"])
def test_under_bf16_autocast_it_is_as_close_to_float64_as_bf16_allows(scores):
    """Against the float64 loop of the same weights: features within 1% of their largest value, every gradient within
    5% of its own (measured: 0.3%, and at most 3.1%, U_a's bias; the recorded bf16 loop itself is 6.7% off on W_a's
    gradient and 7.2% on U_a's bias, the one operation 0.7% and 3.1%)."""
    model = toy()
    exact = run(copy.deepcopy(model).double(), None)
    fused = run(model, scores, autocast=True)

    def off(ours: torch.Tensor, truth: torch.Tensor) -> float:
        return float((ours.double() - truth).abs().max() / truth.abs().max())

    assert off(fused[0], exact[0]) < 0.01
    assert fused[1].keys() == exact[1].keys()
    assert {
        name: off(grad, exact[1][name]) for name, grad in fused[1].items() if off(grad, exact[1][name]) >= 0.05
    } == {}


@built
@pytest.mark.parametrize("width", [1, 16, 37, 64])
def test_the_c_score_equals_torch_in_float32_within_rounding(width):
    """Scores, q's, the keys' and v's gradients against autograd over tanh(q + k) @ v in float32 from the same bf16
    inputs; q a view of a wider product's first columns; a key whose gradient is 0 adds nothing; dkeys and dv_rows
    are added into, not overwritten."""
    g = torch.Generator().manual_seed(width)
    B, S = 9, 11
    q = torch.randn(B, width + 5, generator=g).bfloat16()[:, :width]
    keys, v = torch.randn(B, S, width, generator=g).bfloat16(), torch.randn(width, generator=g)
    grad = torch.randn(B, S, generator=g)
    grad[:, -3:] = 0
    dkeys, dv_rows = torch.ones(B, S, width), torch.ones(B, width)
    scores = native.additive_scores_forward(q, keys, v)
    dq = native.additive_scores_backward(q, keys, v, grad, dkeys, dv_rows)
    qf, kf, vf = (t.float().requires_grad_() for t in (q, keys, v))
    reference = torch.tanh(qf[:, None] + kf) @ vf
    (reference * grad).sum().backward()
    torch.testing.assert_close(scores, reference.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dq, qf.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dkeys - 1, kf.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dv_rows.sum(0) - B, vf.grad, rtol=1e-4, atol=1e-4)
    assert torch.equal(dkeys[:, -3:], torch.ones(B, 3, width))


@built
def test_the_c_score_gives_the_same_bits_on_one_thread_or_two_and_takes_empty_batches():
    g = torch.Generator().manual_seed(0)
    q, keys, v = (
        torch.randn(64, 256, generator=g).bfloat16(),
        torch.randn(64, 30, 256, generator=g).bfloat16(),
        torch.randn(256),
    )
    grad, threads, results = torch.randn(64, 30, generator=g), torch.get_num_threads(), []
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            dkeys, dv_rows = torch.zeros(64, 30, 256), torch.zeros(64, 256)
            dq = native.additive_scores_backward(q, keys, v, grad, dkeys, dv_rows)
            results.append((native.additive_scores_forward(q, keys, v), dq, dkeys, dv_rows))
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(a, b) for a, b in zip(*results))
    empty = native.additive_scores_forward(q[:0], keys[:0], v)
    assert empty.shape == (0, 30)
    assert native.additive_scores_forward(q, keys[:, :0], v).shape == (64, 0)


@built
def test_the_c_score_refuses_what_it_cannot_read_in_one_line():
    q, keys, v = torch.randn(4, 8).bfloat16(), torch.randn(4, 3, 8).bfloat16(), torch.randn(8)
    with pytest.raises(ValueError, match=r"native.additive_scores_forward: keys must be a CPU bfloat16 tensor"):
        native.additive_scores_forward(q, keys.float(), v)
    with pytest.raises(ValueError, match=r"native.additive_scores_forward: q \(4, 7\) \(row stride 7\): expected"):
        native.additive_scores_forward(q[:, :7].contiguous(), keys, v)
    with pytest.raises(ValueError, match=r"native.additive_scores_forward: v: 9 values for keys of width 8"):
        native.additive_scores_forward(q, keys, torch.randn(9))
    with pytest.raises(ValueError, match=r"native.additive_scores_backward: dkeys \(4, 3, 7\): expected \(4, 3, 8\)"):
        native.additive_scores_backward(q, keys, v, torch.randn(4, 3), torch.zeros(4, 3, 7), torch.zeros(4, 8))


@pytest.mark.parametrize(
    "settings",
    [{"cell": "lstm"}, {"layers": 2}, {"window": "local_p"}, {"attention": "hard"}, {"score": "general"}],
    ids=["lstm", "two-layers", "local-p", "hard", "general"],
)
def test_decoders_it_does_not_cover_run_the_step_by_step_loop(settings):
    """Within looped_by, an LSTM, a second layer, a local window, hard attention or another score take the recorded
    loop: the same features bit for bit."""
    model = toy(**settings)
    assert not model.decoder.fusable()
    assert torch.equal(run(model, TorchScores())[0], run(model, None)[0])


def test_attention_weights_asked_for_take_the_step_by_step_loop():
    model = toy()
    src, mask, tgt = batch()
    with looped_by(TorchScores()):
        features, attn = model.decoder.features(tgt, model.encoder(src, mask), need_attn=True)
    assert attn is not None and attn.shape == (5, 6, 7)
    torch.testing.assert_close(attn.sum(-1), torch.ones(5, 6))


def test_the_setting_resolves_per_precision_and_device():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert resolve_decoder_loop("steps", "bf16", cpu) is None
    assert resolve_decoder_loop("auto", "fp32", cpu) is None  # the attention study's fp32 runs: as recorded
    assert resolve_decoder_loop("auto", "bf16", cuda) is None
    assert isinstance(resolve_decoder_loop("fused", "fp32", cpu), TorchScores)
    expected = TorchScores if native.library() is None else NativeScores
    assert isinstance(resolve_decoder_loop("auto", "bf16", cpu), expected)
    with pytest.raises(ValueError, match="decoder loop 'fast': expected one of auto, fused, steps"):
        resolve_decoder_loop("fast", "bf16", cpu)


@built
def test_bf16_training_learns_as_with_the_step_by_step_loop(corpus, tmp_path):  # noqa: F811
    """A toy Bahdanau model (GRU, additive, dropout 0.2) trained 240 bf16 updates with the loop as one operation and
    step by step: other rounding and other dropout draws, so other losses update by update, but the same curve: every
    window of 40 updates has a mean loss within 0.05 of the other's, and both fall."""
    ours = bf16_losses(corpus, tmp_path, "fused", ["train.decoder_loop=fused"], model="bahdanau")
    theirs = bf16_losses(corpus, tmp_path, "steps", ["train.decoder_loop=steps"], model="bahdanau")
    assert None not in ours and None not in theirs and ours != theirs
    means = [
        (statistics.fmean(ours[i : i + WINDOW]), statistics.fmean(theirs[i : i + WINDOW]))
        for i in range(0, STEPS, WINDOW)
    ]
    assert all(abs(a - b) < 0.05 for a, b in means), means
    assert means[-1][0] < means[0][0] - 0.5 and means[-1][1] < means[0][1] - 0.5, means
