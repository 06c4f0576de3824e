"""The trainer's loss: label-smoothed cross-entropy worked by hand, padding ignored, and an update's loss
and gradient normalised by the real target tokens of all its batches.

A scripted stand-in for the model returns fixed logits, so the expected values come from the formula
alone: with p = softmax(z), the token loss is (1 - eps) (-log p_y) + eps * mean_k (-log p_k) (torch's
label smoothing: eps spread over all V classes), and its gradient in z is p - q, q = (1 - eps) onehot(y) + eps / V.
"""

import math

import pytest
import torch

from nmt.data.batching import Batch, make_batch
from nmt.data.tokenizer import PAD
from nmt.training.trainer import Trainer
from tests.conftest import tiny_config

P_SKEWED = [0.1, 0.2, 0.3, 0.4]  # a V = 4 distribution
P_UNIFORM = [0.25] * 4


class Scripted(torch.nn.Module):
    """Stands in for the model: the k-th call returns the k-th logits (B, T, V), whatever the batch (rows
    (N, V) of the live positions when the trainer passes them, as Seq2Seq does)."""

    def __init__(self, *logits: torch.Tensor):
        super().__init__()
        self.logits = torch.nn.ParameterList(torch.nn.Parameter(z.clone()) for z in logits)
        self.calls = 0

    def forward(self, src, src_mask, tgt_in, live=None):
        self.calls += 1
        logits = self.logits[self.calls - 1]
        return logits if live is None else logits[live]


def logits_of(*rows: list[float]) -> torch.Tensor:
    """(1, T, V) logits log p for the given distributions p, so that softmax gives p back."""
    return torch.log(torch.tensor([rows]))


def batch_of(targets: list[int]) -> Batch:
    """A one-sentence batch whose target tokens (tgt_out) are `targets` (PAD for padding); the rest is unused."""
    tgt = torch.tensor([targets])
    return Batch(src=tgt.clone(), src_mask=torch.ones_like(tgt, dtype=torch.bool), tgt_in=tgt.clone(), tgt_out=tgt)


@pytest.fixture
def trainer(toy_dir, toy_cache, tmp_path):
    return Trainer(tiny_config(toy_dir, toy_cache, label_smoothing=0.2), tmp_path / "run", log=lambda line: None)


@pytest.mark.parametrize("eps, expected", [(0.0, math.log(10)), (0.2, 2.420941)])
def test_label_smoothed_loss_worked_by_hand(trainer, eps, expected):
    """Fails if the smoothing mass went to the V - 1 wrong classes only (1.074099 + 1.386294 = 2.460393 at
    eps = 0.2), if eps were ignored, or if the loss were averaged instead of summed."""
    # token 1: p = (0.1, 0.2, 0.3, 0.4), y = 3: -log p_y = -ln 0.4 = 0.916291
    #   mean_k -log p_k = (2.302585 + 1.609438 + 1.203973 + 0.916291) / 4 = 1.508072
    #   eps = 0.2: 0.8 * 0.916291 + 0.2 * 1.508072 = 0.733033 + 0.301614 = 1.034647
    # token 2: p uniform, y = 1: both terms are ln 4 = 1.386294 for any eps
    # sum, eps = 0: 0.916291 + 1.386294 = 2.302585 = ln 10;  eps = 0.2: 1.034647 + 1.386294 = 2.420941
    loss = trainer.loss(batch_of([3, 1]), eps, net=Scripted(logits_of(P_SKEWED, P_UNIFORM)))
    assert float(loss.detach()) == pytest.approx(expected, abs=1e-5)


@pytest.mark.parametrize("eps", [0.0, 0.2])
def test_padded_positions_change_neither_loss_nor_gradient(trainer, eps):
    """Fails if PAD targets were scored (ignore_index missing) or smoothed."""
    plain = Scripted(logits_of(P_SKEWED, P_UNIFORM))
    padded = Scripted(
        torch.cat([logits_of(P_SKEWED, P_UNIFORM), torch.tensor([[[5.0, -3.0, 0.5, 2.0], [0.0, 9.0, -9.0, 1.0]]])], 1)
    )
    loss_plain = trainer.loss(batch_of([3, 1]), eps, net=plain)
    loss_padded = trainer.loss(batch_of([3, 1, PAD, PAD]), eps, net=padded)
    assert float(loss_padded.detach()) == pytest.approx(float(loss_plain.detach()), abs=1e-6)
    (loss_plain + loss_padded).backward()
    torch.testing.assert_close(padded.logits[0].grad[:, :2], plain.logits[0].grad)
    assert (padded.logits[0].grad[:, 2:] == 0).all()


def test_an_update_is_normalised_by_the_real_target_tokens_of_all_its_batches(trainer):
    """Two batches of 2 and 1 real tokens (and padding): the update's loss and gradient are sums over the 3 tokens / 3.

    Fails if each batch were averaged on its own (then (2.420941 / 2 + 1.386294) / 2 = 1.298382), if padding
    counted as tokens, or if the sum were not divided.
    """
    net = Scripted(logits_of(P_SKEWED, P_UNIFORM, P_UNIFORM), logits_of(P_UNIFORM, P_SKEWED))
    trainer.net = net
    batches = [batch_of([3, 1, PAD]), batch_of([2, PAD])]
    # token losses at eps = 0.2 (test above): 1.034647, 1.386294, and 1.386294 in the second batch
    # (1.034647 + 1.386294 + 1.386294) / 3 = 3.807235 / 3 = 1.269078
    assert trainer.train_step(batches) == pytest.approx(1.269078, abs=1e-5)
    assert net.calls == 2
    # gradient p - q over 3 tokens, q = 0.8 onehot(y) + 0.2 / 4:
    #   y = 3, p = (0.1, 0.2, 0.3, 0.4): q = (0.05, 0.05, 0.05, 0.85), p - q = (0.05, 0.15, 0.25, -0.45)
    #   y = 1, p uniform: q = (0.05, 0.85, 0.05, 0.05), p - q = (0.2, -0.6, 0.2, 0.2)
    #   y = 2, p uniform: p - q = (0.2, 0.2, -0.6, 0.2)
    expected_first = torch.tensor([[[0.05, 0.15, 0.25, -0.45], [0.2, -0.6, 0.2, 0.2], [0.0] * 4]]) / 3
    expected_second = torch.tensor([[[0.2, 0.2, -0.6, 0.2], [0.0] * 4]]) / 3
    torch.testing.assert_close(net.logits[0].grad, expected_first)
    torch.testing.assert_close(net.logits[1].grad, expected_second)


def test_a_padded_batch_has_the_loss_of_its_sentences_alone(trainer):
    """Through the real model: the summed loss of a padded batch is the sum of its sentences' losses alone.

    Fails if the model let padding into a real position (source or target) or the loss scored padding.
    """
    pairs = [([5, 6, 7, 8, 9], [10, 11]), ([12, 13], [14, 15, 16, 17, 18]), ([19], [20, 21, 22])]
    model = trainer.model.eval()
    with torch.no_grad():
        together = trainer.loss(make_batch([s for s, _ in pairs], [t for _, t in pairs]), 0.1, net=model)
        alone = [trainer.loss(make_batch([s], [t]), 0.1, net=model) for s, t in pairs]
    assert float(together) == pytest.approx(float(sum(alone)), rel=1e-5)
    assert make_batch([s for s, _ in pairs], [t for _, t in pairs]).target_tokens == sum(len(t) + 1 for _, t in pairs)


# --- the blockwise loss against torch's own -----------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_blockwise_loss_and_gradient_equal_torch_cross_entropy(monkeypatch, dtype, eps):
    """Value and gradient equal F.cross_entropy(label_smoothing=eps, reduction="sum") on float32 logits,
    over several blocks with a ragged last one; the gradient comes back in the logits' dtype."""
    from nmt.training import loss as loss_module

    monkeypatch.setattr(loss_module, "BLOCK_ELEMENTS", 7 * 50)  # 7 rows a block: 23 rows = 3 full blocks and 2 rows
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(23, 50, generator=g) * 4).to(dtype)
    target = torch.randint(0, 50, (23,), generator=g)
    mine = logits.clone().requires_grad_()
    ref = logits.float().requires_grad_()
    got = loss_module.smoothed_cross_entropy(mine, target, eps)
    want = torch.nn.functional.cross_entropy(ref, target, label_smoothing=eps, reduction="sum")
    (2.5 * got).backward()
    (2.5 * want).backward()
    assert got.dtype == torch.float32
    assert float(got.detach()) == pytest.approx(float(want.detach()), rel=1e-6)
    assert mine.grad.dtype == dtype
    torch.testing.assert_close(
        mine.grad.float(),
        ref.grad,
        atol=1e-6 if dtype == torch.float32 else 2e-2,
        rtol=1e-5 if dtype == torch.float32 else 1e-2,
    )


needs_kernels = pytest.mark.skipif(
    __import__("nmt.engine.native", fromlist=["library"]).library() is None, reason="no C compiler here"
)


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("eps", [0.0, 0.1])
@pytest.mark.parametrize("rows, vocab", [(23, 50), (70, 4000), (1, 1), (3, 17)])
def test_native_loss_kernels_equal_torch_within_rounding(dtype, eps, rows, vocab):
    """kernel="native" (nmt's C kernels, one pass per row, threads sharing the rows above 2^18 elements): the same
    loss and gradient as F.cross_entropy on float32 logits, within rounding, the gradient in the logits' dtype (bf16
    rounded to nearest even); a row's loss does not depend on the other rows."""
    from nmt.training.loss import smoothed_cross_entropy

    g = torch.Generator().manual_seed(1)
    logits = (torch.randn(rows, vocab, generator=g) * 4).to(dtype)
    target = torch.randint(0, vocab, (rows,), generator=g)
    mine = logits.clone().requires_grad_()
    ref = logits.float().requires_grad_()
    got = smoothed_cross_entropy(mine, target, eps, kernel="native")
    want = torch.nn.functional.cross_entropy(ref, target, label_smoothing=eps, reduction="sum")
    (2.5 * got).backward()
    (2.5 * want).backward()
    assert got.dtype == torch.float32 and mine.grad.dtype == dtype
    assert float(got.detach()) == pytest.approx(float(want.detach()), rel=2e-6, abs=1e-5)
    expected = ref.grad if dtype == torch.float32 else ref.grad.to(torch.bfloat16).float()
    torch.testing.assert_close(mine.grad.float(), expected, atol=1e-6, rtol=1e-5 if dtype == torch.float32 else 8e-3)
    alone = smoothed_cross_entropy(logits[-1:], target[-1:], eps, kernel="native")
    per_row = torch.nn.functional.cross_entropy(ref[-1:].detach(), target[-1:], label_smoothing=eps, reduction="sum")
    assert float(alone) == pytest.approx(float(per_row), rel=2e-6, abs=1e-5)


@needs_kernels
def test_native_loss_propagates_nan_and_inf_as_torch_does():
    """A NaN or infinite logit makes its row's loss non-finite (the trainer then skips the update), not a number."""
    from nmt.training.loss import smoothed_cross_entropy

    for bad in (float("nan"), float("inf")):
        logits = torch.zeros(3, 40)
        logits[1, 7] = bad
        loss = smoothed_cross_entropy(logits, torch.tensor([1, 2, 3]), 0.1, kernel="native")
        assert not torch.isfinite(loss)


def test_the_loss_kernel_choice():
    """auto: native for bf16 logits on a CPU (where the kernels are built), torch for fp32; an unknown name fails."""
    from nmt.engine import native
    from nmt.training.loss import resolve_kernel

    built = "native" if native.library() is not None else "torch"
    assert resolve_kernel("auto", torch.zeros(2, 3, dtype=torch.bfloat16)) == built
    assert resolve_kernel("auto", torch.zeros(2, 3)) == "torch"
    assert resolve_kernel("native", torch.zeros(2, 3)) == built
    assert resolve_kernel("native", torch.zeros(2, 3, dtype=torch.float64)) == "torch"
    assert resolve_kernel("torch", torch.zeros(2, 3, dtype=torch.bfloat16)) == "torch"
    with pytest.raises(ValueError, match="loss kernel 'fast'"):
        resolve_kernel("fast", torch.zeros(2, 3))


def test_blockwise_loss_rejects_misshapen_inputs():
    from nmt.training.loss import smoothed_cross_entropy

    with pytest.raises(ValueError, match="logits .N, V. and target .N,."):
        smoothed_cross_entropy(torch.zeros(2, 3, 4), torch.zeros(2, dtype=torch.long))


@pytest.mark.parametrize("arch", ["transformer", "bahdanau", "luong"])
def test_logits_of_the_live_positions_are_those_of_the_full_forward(arch):
    """Seq2Seq.forward(..., live) runs the output layer on the live positions only; they equal the full logits there."""
    from nmt.config import ModelConfig
    from nmt.models.builders import build_model
    from tests.conftest import random_batch

    torch.manual_seed(0)
    cfg = ModelConfig(
        arch=arch, dim=16, layers=2, heads=2, ffn_dim=32, dropout=0.0, cell="lstm" if arch == "luong" else "gru"
    )
    model = build_model(cfg, 30, 30, joint=True).eval()
    batch = random_batch(30)
    live = batch.tgt_out != PAD
    with torch.no_grad():
        full = model(batch.src, batch.src_mask, batch.tgt_in)  # (B, T, V)
        rows = model(batch.src, batch.src_mask, batch.tgt_in, live)  # (N, V)
    assert rows.shape == (int(live.sum()), 30)
    torch.testing.assert_close(rows, full[live])
