"""Dropout (Srivastava et al. 2014) whose mask costs less on a CPU.

torch's CPU dropout draws one Bernoulli variable per element from the Mersenne twister, about 6 ns each
here: a tenth of a bf16 Transformer update went to its masks. `dropout` draws 64 random bits at a time
and cuts them into four 16-bit uniform integers, one per element, so an element is dropped with
probability round(p * 65536) / 65536 (p to within 1e-5) and the kept ones are scaled by the inverse of
the exact keep rate: the expectation is unchanged. On other devices it is F.dropout. Both draw from
torch's default generator, whose state checkpoints save.

`drawn_by(kernel)` hands the CPU dropout inside it to another implementation, kernel(x, p) (the trainer's: nmt's C
kernel for bf16 training, nmt/training/native_dropout.py); the models themselves never import a kernel.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch
import torch.nn.functional as F
from torch import nn

LEVELS = 1 << 16  # the mask's resolution: one 16-bit integer per element
_KERNEL: ContextVar[Callable[[torch.Tensor, float], torch.Tensor] | None] = ContextVar("dropout_kernel", default=None)


@contextmanager
def drawn_by(kernel: Callable[[torch.Tensor, float], torch.Tensor] | None) -> Iterator[None]:
    """Within: CPU dropout at a rate 0 < p < 1 in training is kernel(x, p) (None: the 16-bit mask below)."""
    token = _KERNEL.set(kernel)
    try:
        yield
    finally:
        _KERNEL.reset(token)


def keep_mask(shape: torch.Size, p: float, device: torch.device) -> tuple[torch.Tensor, float]:
    """A bool mask of `shape`, True with probability 1 - round(p * 65536) / 65536, and that keep rate's inverse."""
    dropped = round(p * LEVELS)
    count = shape.numel()
    words = torch.empty((count + 3) // 4, dtype=torch.int64, device=device).random_(
        -(1 << 63), None
    )  # 64 uniform bits each
    bits = words.view(torch.int16)[:count].view(shape)  # uniform over -32768 .. 32767
    return bits >= dropped - LEVELS // 2, LEVELS / (LEVELS - dropped)


def dropout(x: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    """F.dropout(x, p, training), with the 16-bit mask above on a CPU."""
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu" or p >= 1.0:
        return F.dropout(x, p, training)
    kernel = _KERNEL.get()
    if kernel is not None:
        return kernel(x, p)
    keep, scale = keep_mask(x.shape, p, x.device)
    return x * (keep.to(x.dtype) * scale)


class Dropout(nn.Dropout):
    """nn.Dropout through `dropout` (same parameters, same state dict: none)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)
