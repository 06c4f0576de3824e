"""The training loss: label-smoothed token cross-entropy, summed, over rows of logits (the live target positions).

    loss_i = (1 - eps) * (lse_i - x_{i,y_i}) + eps * (lse_i - mean_v x_{i,v}),    lse_i = log sum_v exp(x_{i,v})
    d loss_i / d x_{i,v} = softmax(x_i)_v - eps / V - (1 - eps) * [v == y_i]
the same value as F.cross_entropy(x, y, label_smoothing=eps, reduction="sum") (Szegedy et al. 2016).

`smoothed_cross_entropy` computes it a block of rows at a time, in float32 whatever the logits' dtype (bf16
under autocast), and writes the gradient in the logits' dtype: no (N, V) float32 copy, log-softmax or
gradient of it is ever held (the backward pass computes each block's softmax again). The output layer's
logits are the largest tensor of a step (N x V, 8,000 words x 4,000 tokens), and with F.cross_entropy
casting them, normalising them and adding the two terms' gradients took about a third of a bf16
Transformer update on a CPU; blocks that stay in the cache take a fraction of it.

`kernel="native"` computes the same loss and gradient with nmt's C kernels (nmt/engine/csrc/loss.c): one pass
over each row in the forward (its logsumexp kept, N floats) and one in the backward, reading bf16 logits as they
are; within rounding of the torch path (its own exp, sums in 16 lanes), about 4x faster on one core
(docs/benchmarks.md). `resolve_kernel` picks it for bf16 logits by default ("auto"; `train.loss_kernel`).

Shape legend: N rows (target tokens), V vocab.
"""

from __future__ import annotations

import torch

from nmt.engine import native

BLOCK_ELEMENTS = 1 << 18  # rows per block: about 1 MiB of float32 logits, which stays in the cache


def _blocks(rows: int, vocab: int) -> range:
    return range(0, rows, max(1, BLOCK_ELEMENTS // max(vocab, 1)))


class _SmoothedCrossEntropy(torch.autograd.Function):
    """Forward: log_softmax of each block; backward: softmax of each block again (nothing (N, V) is saved but the
    logits). torch's softmax kernels, not torch.exp: its exp is several times slower here, and tens of times
    slower where it returns subnormal numbers (a trained model's unlikely words)."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, target: torch.Tensor, smoothing: float) -> torch.Tensor:  # type: ignore[override]
        rows, vocab = logits.shape
        blocks = _blocks(rows, vocab)
        total = torch.zeros((), dtype=torch.float32, device=logits.device)
        for start in blocks:
            logp = torch.log_softmax(logits[start : start + blocks.step].float(), 1)  # (n, V)
            nll = -logp.gather(1, target[start : start + blocks.step, None]).sum()
            total += (1 - smoothing) * nll - smoothing * logp.mean(1).sum() if smoothing else nll
        ctx.save_for_backward(logits, target)
        ctx.smoothing = smoothing
        return total

    @staticmethod
    def backward(ctx, grad_total: torch.Tensor):  # type: ignore[override]
        logits, target = ctx.saved_tensors
        rows, vocab = logits.shape
        blocks, eps = _blocks(rows, vocab), ctx.smoothing
        grad = torch.empty_like(logits)
        for start in blocks:
            p = torch.softmax(logits[start : start + blocks.step].float(), 1)  # (n, V)
            if eps:
                p.sub_(eps / vocab)
            y = target[start : start + blocks.step, None]  # (n, 1)
            p.scatter_add_(1, y, torch.full(y.shape, -(1 - eps), dtype=p.dtype, device=p.device))
            grad[start : start + blocks.step] = p.mul_(grad_total)
        return grad, None, None


class _NativeSmoothedCrossEntropy(torch.autograd.Function):
    """The same loss and gradient from nmt's kernels: the forward keeps each row's logsumexp for the backward."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, target: torch.Tensor, smoothing: float) -> torch.Tensor:  # type: ignore[override]
        loss, lse = native.xent_forward(logits, target, smoothing)
        ctx.save_for_backward(logits, target, lse)
        ctx.smoothing = smoothing
        return loss.sum()

    @staticmethod
    def backward(ctx, grad_total: torch.Tensor):  # type: ignore[override]
        logits, target, lse = ctx.saved_tensors
        return native.xent_backward(logits, target, ctx.smoothing, lse, float(grad_total)), None, None


KERNELS = ("auto", "native", "torch")


def resolve_kernel(kernel: str, logits: torch.Tensor) -> str:
    """ "native" or "torch" for these logits: auto is native for bf16 logits on a CPU where the kernels are built
    (fp32 keeps torch's path, whose results the attention study's fp32 grid records); native falls back to torch
    where the kernels cannot take the logits (another device or dtype, or no compiler)."""
    if kernel not in KERNELS:
        raise ValueError(f"loss kernel {kernel!r}: expected one of {', '.join(KERNELS)}")
    if kernel == "torch" or not logits.is_cpu or logits.dtype not in (torch.float32, torch.bfloat16):
        return "torch"
    if kernel == "auto" and logits.dtype is not torch.bfloat16:
        return "torch"
    return "native" if native.library() is not None else "torch"


def smoothed_cross_entropy(
    logits: torch.Tensor, target: torch.Tensor, smoothing: float = 0.0, kernel: str = "torch"
) -> torch.Tensor:
    """Summed label-smoothed cross-entropy of logits (N, V) against target (N,), a float32 scalar.

    Every row counts (select the live target positions before the output layer); equals
    F.cross_entropy(logits.float(), target, label_smoothing=smoothing, reduction="sum") (kernel "torch": blockwise
    torch operators; "native": nmt's C kernels, within rounding; "auto": `resolve_kernel`).
    """
    if logits.dim() != 2 or target.shape != logits.shape[:1]:
        raise ValueError(f"logits (N, V) and target (N,) expected, got {tuple(logits.shape)} and {tuple(target.shape)}")
    if resolve_kernel(kernel, logits) == "native":
        return _NativeSmoothedCrossEntropy.apply(logits.contiguous(), target.contiguous(), float(smoothing))
    return _SmoothedCrossEntropy.apply(logits, target, float(smoothing))
