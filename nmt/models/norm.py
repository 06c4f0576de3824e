"""The Transformer's layer normalization (Ba, Kiros and Hinton 2016), LN(x) = (x - mean) / sqrt(var + eps) * w + b
over the last dimension, where another implementation may compute it.

`InputNorm` is an nn.LayerNorm (the same parameters and state dict) for the norms whose output feeds only products:
a pre-norm sub-layer's input and the final norms of a pre-norm stack. Within `normed_by(kernel)` its forward is
kernel(x, weight, bias, eps) (the trainer's: nmt's C kernel for bf16 training, which writes the output in bf16 for
the bf16 products that read it, nmt/training/native_norm.py); elsewhere it is nn.LayerNorm's. A post-norm's output is
the residual stream itself and stays an nn.LayerNorm. The models never import a kernel.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch
from torch import nn

NormKernel = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float], torch.Tensor]
_KERNEL: ContextVar[NormKernel | None] = ContextVar("norm_kernel", default=None)


@contextmanager
def normed_by(kernel: NormKernel | None) -> Iterator[None]:
    """Within: every InputNorm is kernel(x, weight, bias, eps) (None: nn.LayerNorm's forward)."""
    token = _KERNEL.set(kernel)
    try:
        yield
    finally:
        _KERNEL.reset(token)


class InputNorm(nn.LayerNorm):
    """nn.LayerNorm for an output that only products read (x (..., H) -> (..., H)), through `normed_by`'s kernel."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kernel = _KERNEL.get()
        if kernel is None or self.weight is None or self.bias is None:
            return super().forward(x)
        return kernel(x, self.weight, self.bias, self.eps)
