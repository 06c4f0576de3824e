"""Layer normalization for bf16 training with nmt's C kernel (nmt/engine/csrc/layernorm.c): the output written in
bf16 and the gradient read in bf16.

Under bf16 autocast torch computes a LayerNorm in float32 and the product that reads it casts the output to bf16; in
backward the product's bf16 gradient is cast back to float32 for LayerNorm's backward: two extra passes over a
(B, T, H) tensor each way, for each of the Transformer's 17 norms (the casts were ~10% of a bf16 update's operator
time). The kernel computes the same float32 normalization and rounds it to bf16 once; its backward reads the bf16
gradient directly. The result equals torch's within float32 rounding of the row sums (a test trains with and without
it and compares the loss curves).

`train.norm_kernel`: torch (the default for now), native, or auto (`resolve_norm_kernel`): native for bf16 training on
a CPU where the kernels are built; torch in fp32, whose numbers the attention study's fp32 grid records. It stays
opt-in until the published figures of bf16-trained Transformers (the 10-minute recipe, the decoding tables' model)
are measured again with it: their runs would round differently. Only `InputNorm`s (the
norms whose output feeds products, nmt/models/norm.py) use it, and only where autocast makes bf16 products on the
CPU: elsewhere (fp32, a post-norm, decoding) they are nn.LayerNorm's.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from nmt.engine import native
from nmt.models.norm import NormKernel
from nmt.training.native_dropout import resolve_training_kernel


class _NativeNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:  # type: ignore[override]
        shape = x.shape
        rows = x.reshape(-1, shape[-1])
        y, mean, rstd = native.layer_norm_bf16_forward(rows, weight.detach(), bias.detach(), eps)
        ctx.save_for_backward(rows, weight, mean, rstd)
        ctx.shape = shape
        return y.view(shape)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        rows, weight, mean, rstd = ctx.saved_tensors
        grad = grad.reshape(rows.shape)
        if grad.dtype not in (torch.bfloat16, torch.float32):
            grad = grad.float()
        dx, dw, db = native.layer_norm_bf16_backward(rows, grad.contiguous(), weight.detach(), mean, rstd)
        return dx.view(ctx.shape), dw, db, None


def bf16_products() -> bool:
    """Whether autocast makes bf16 products on the CPU here (the kernel's output is what they would read)."""
    return torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") is torch.bfloat16


def native_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    """LN(x) over the last dimension: bf16 by the C kernel for fp32 CPU x under CPU bf16 autocast (an output that
    bf16 products read), else F.layer_norm."""
    if not (x.is_cpu and x.dtype is torch.float32 and weight.dtype is torch.float32 and bf16_products()):
        return F.layer_norm(x, x.shape[-1:], weight, bias, eps)
    return _NativeNorm.apply(x.contiguous(), weight, bias, eps)


def resolve_norm_kernel(kernel: str, precision: str, device: torch.device) -> NormKernel | None:
    """The layer norm `normed_by` gets for training in `precision` on `device`: native_norm, or None (torch's)."""
    return resolve_training_kernel("norm", kernel, precision, device, native_norm)
