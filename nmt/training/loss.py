"""The training loss: label-smoothed token cross-entropy, summed, over rows of logits (the live target positions).

    loss_i = (1 - eps) * (lse_i - x_{i,y_i}) + eps * (lse_i - mean_v x_{i,v}),    lse_i = log sum_v exp(x_{i,v})
    d loss_i / d x_{i,v} = softmax(x_i)_v - eps / V - (1 - eps) * [v == y_i]
the same value as F.cross_entropy(x, y, label_smoothing=eps, reduction="sum") (Szegedy et al. 2016).

`smoothed_cross_entropy` computes it a block of rows at a time, in float32 whatever the logits' dtype (bf16
under autocast), and writes the gradient in the logits' dtype: no (N, V) float32 copy, log-softmax or
gradient of it is ever held. The output layer's logits are the largest tensor of a step (N x V, 8,000 words
x 4,000 tokens), and with F.cross_entropy casting them, normalising them and adding the two terms' gradients
took about a third of a bf16 Transformer update on a CPU; blocks that stay in the cache take a fraction of it.

Shape legend: N rows (target tokens), V vocab.
"""

from __future__ import annotations

import torch

BLOCK_ELEMENTS = 1 << 18  # rows per block: about 1 MiB of float32 logits, which stays in the cache


def _blocks(rows: int, vocab: int) -> range:
    return range(0, rows, max(1, BLOCK_ELEMENTS // max(vocab, 1)))


class _SmoothedCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: torch.Tensor, target: torch.Tensor, smoothing: float) -> torch.Tensor:  # type: ignore[override]
        rows, vocab = logits.shape
        step = _blocks(rows, vocab).step
        lse = torch.empty(rows, dtype=torch.float32, device=logits.device)  # (N,)
        total = torch.zeros((), dtype=torch.float32, device=logits.device)
        for start in _blocks(rows, vocab):
            x = logits[start : start + step].float()  # (n, V)
            y = target[start : start + step, None]  # (n, 1)
            block_lse = torch.logsumexp(x, 1)  # (n,)
            lse[start : start + step] = block_lse
            nll = block_lse - x.gather(1, y).squeeze(1)
            loss = nll if smoothing == 0 else (1 - smoothing) * nll + smoothing * (block_lse - x.mean(1))
            total += loss.sum()
        ctx.save_for_backward(logits, target, lse)
        ctx.smoothing = smoothing
        return total

    @staticmethod
    def backward(ctx, grad_total: torch.Tensor):  # type: ignore[override]
        logits, target, lse = ctx.saved_tensors
        rows, vocab = logits.shape
        step, eps = _blocks(rows, vocab).step, ctx.smoothing
        grad = torch.empty_like(logits)
        for start in _blocks(rows, vocab):
            p = logits[start : start + step].to(torch.float32, copy=True)  # (n, V)
            p.sub_(lse[start : start + step, None]).exp_()  # softmax
            if eps:
                p.sub_(eps / vocab)
            y = target[start : start + step, None]  # (n, 1)
            p.scatter_add_(1, y, torch.full(y.shape, -(1 - eps), dtype=p.dtype, device=p.device))
            grad[start : start + step] = p.mul_(grad_total)
        return grad, None, None


def smoothed_cross_entropy(logits: torch.Tensor, target: torch.Tensor, smoothing: float = 0.0) -> torch.Tensor:
    """Summed label-smoothed cross-entropy of logits (N, V) against target (N,), a float32 scalar.

    Every row counts (select the live target positions before the output layer); equals
    F.cross_entropy(logits.float(), target, label_smoothing=smoothing, reduction="sum").
    """
    if logits.dim() != 2 or target.shape != logits.shape[:1]:
        raise ValueError(f"logits (N, V) and target (N,) expected, got {tuple(logits.shape)} and {tuple(target.shape)}")
    return _SmoothedCrossEntropy.apply(logits, target, float(smoothing))
