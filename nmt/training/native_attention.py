"""The decoder loop of bf16 training (`train.decoder_loop`, nmt/models/bahdanau_loop.py) with Bahdanau's additive
score in nmt's C kernel (nmt/engine/csrc/additive.c).

At every decoder step torch computes e_bs = v^T tanh(q_b + k_bs) as an addition, a tanh and a product over the
(B, S, A) tensor, and its backward as some ten more passes over it: with the decoder's T steps, the largest part of
a bf16 RNN update that is not a matrix product. The kernel reads q and the keys in bf16 once per pass, computes
q + k and the tanh in float32 and writes the (B, S) scores; its backward recomputes the tanh and writes q's
gradient and adds the keys' and v's in the same pass.

`train.decoder_loop`: steps (one recorded `advance` per step), fused (the loop as one operation, the score in C for
bf16 on a CPU where the kernels are built, in torch otherwise) or auto, the default: fused for bf16 training on a CPU,
steps in fp32, whose numbers the attention study's fp32 grid records.
"""

from __future__ import annotations

import torch
from torch import Tensor

from nmt.engine import native
from nmt.models.bahdanau_loop import Scores, TorchScores

LOOPS = ("auto", "fused", "steps")


class NativeScores(TorchScores):
    """The additive score by the C kernel for bf16 q and keys (B, A) and (B, S, A); torch's for other dtypes."""

    def forward(self, q: Tensor, keys: Tensor, v: Tensor) -> Tensor:
        if q.dtype is not torch.bfloat16 or keys.dtype is not torch.bfloat16:
            return super().forward(q, keys, v)
        return native.additive_scores_forward(q, keys, v.detach().float().contiguous())

    def backward(self, q: Tensor, keys: Tensor, v: Tensor, grad: Tensor, dkeys: Tensor, dv_rows: Tensor) -> Tensor:
        if q.dtype is not torch.bfloat16 or keys.dtype is not torch.bfloat16 or dkeys.dtype is not torch.float32:
            return super().backward(q, keys, v, grad, dkeys, dv_rows)
        v = v.detach().float().contiguous()
        return native.additive_scores_backward(q, keys, v, grad.contiguous(), dkeys, dv_rows)


def resolve_decoder_loop(loop: str, precision: str, device: torch.device) -> Scores | None:
    """The `Scores` `looped_by` gets for training in `precision` on `device` (None: the step-by-step loop)."""
    if loop not in LOOPS:
        raise ValueError(f"decoder loop {loop!r}: expected one of {', '.join(LOOPS)}")
    if loop == "steps" or (loop == "auto" and (precision != "bf16" or device.type != "cpu")):
        return None
    if precision == "bf16" and device.type == "cpu" and native.library() is not None:
        return NativeScores()
    return TorchScores()
