"""Dropout for training with nmt's C kernel (nmt/engine/csrc/dropout.c): the mask drawn and applied in one pass and
never stored; backward draws it again from the same seed.

torch's way (nmt/models/dropout.py) draws 64-bit random words, compares them, casts the mask to the values' dtype
and multiplies twice, forward and backward: ~15% of a bf16 Transformer update's operator time. The kernel keeps the
same rate (16-bit resolution) and the same expectation; its masks are other draws, so a run with it is another run
(equal in distribution, not bit for bit). Its seed is one 64-bit draw from torch's default generator per call, so
checkpoints (which save that generator) resume it exactly.

`train.dropout_kernel`: torch, native, or auto (`resolve_dropout_kernel`): native for bf16 training on a CPU where
the kernels are built; torch in fp32, whose numbers the attention study's fp32 grid records.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from nmt.engine import native
from nmt.models.dropout import LEVELS

KERNELS = ("auto", "native", "torch")


class _NativeDropout(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, word: int, dropped: int, scale: float) -> torch.Tensor:  # type: ignore[override]
        # the seed crosses `apply` as a signed 64-bit word: the profiler's record_shapes converts every argument to
        # a C++ int64 and would refuse one of 2**63 or more
        ctx.draw = (seed, dropped, scale) = (word % (1 << 64), dropped, scale)
        return native.dropout_apply(x, seed, dropped, scale)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        return native.dropout_apply(grad.contiguous(), *ctx.draw), None, None, None


def native_dropout(x: torch.Tensor, p: float) -> torch.Tensor:
    """Dropout of x (CPU, fp32 or bf16) at rate p (0 < p < 1) in training, by the C kernel; other dtypes go to
    torch's F.dropout."""
    if x.dtype not in (torch.float32, torch.bfloat16):
        return torch.nn.functional.dropout(x, p, True)
    dropped = round(p * LEVELS)
    word = int(torch.empty((), dtype=torch.int64).random_(-(1 << 63), None))  # 64 bits of torch's generator
    return _NativeDropout.apply(x.contiguous(), word, dropped, LEVELS / (LEVELS - dropped))


def resolve_training_kernel(what: str, kernel: str, precision: str, device: torch.device, native_fn: Callable):
    """native_fn or None (torch's) for a training kernel setting (`train.dropout_kernel`, `train.norm_kernel`):
    auto is native for bf16 on a CPU; native on another device, or without a C compiler, falls back to torch's."""
    if kernel not in KERNELS:
        raise ValueError(f"{what} kernel {kernel!r}: expected one of {', '.join(KERNELS)}")
    if kernel == "torch" or device.type != "cpu" or (kernel == "auto" and precision != "bf16"):
        return None
    return native_fn if native.library() is not None else None


def resolve_dropout_kernel(kernel: str, precision: str, device: torch.device) -> Callable | None:
    """The dropout `drawn_by` gets for training in `precision` on `device`: native_dropout, or None (torch's)."""
    return resolve_training_kernel("dropout", kernel, precision, device, native_dropout)
