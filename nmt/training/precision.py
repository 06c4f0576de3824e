"""Numeric precision of training: fp32, bf16 autocast, or fp16 autocast with a gradient scaler (CUDA only).

bf16 and fp16 run the forward pass and the loss under `torch.autocast`: matrix products in the lower
precision, while the weights, their gradients and Adam's moments stay fp32 (the "master weights").
fp16's narrow exponent needs the loss scaled up before backward and the gradients scaled back before
clipping (`torch.amp.GradScaler`); bf16 has fp32's exponent and needs no scaler.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import ContextManager

import torch

from nmt.errors import NmtError

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


class Precision:
    """Autocast for the forward pass, and the gradient scaler's hooks around backward and the optimizer step."""

    def __init__(self, name: str, device: torch.device):
        if name == "fp16" and device.type != "cuda":
            raise NmtError(f"train.precision=fp16: needs a CUDA device (training on {device.type}); use bf16 on a CPU")
        self.name, self.device = name, device
        self.scaler = torch.amp.GradScaler(device.type) if name == "fp16" else None

    def autocast(self) -> ContextManager:
        if self.name == "fp32":
            return nullcontext()
        return torch.autocast(self.device.type, dtype=DTYPES[self.name])

    def backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def unscale(self, optimizer: torch.optim.Optimizer) -> None:
        """Bring the gradients back to their true scale before they are clipped."""
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        if self.scaler is not None:
            self.scaler.step(optimizer)
            self.scaler.update()
        else:
            optimizer.step()

    @property
    def overflows(self) -> bool:
        """Whether a non-finite gradient is a normal event (fp16 probing its scale) rather than a diverging run."""
        return self.scaler is not None

    def skipped(self) -> None:
        """An update skipped for a non-finite gradient: fp16 lowers its scale (unscale_ recorded the overflow)."""
        if self.scaler is not None:
            self.scaler.update()

    def state(self) -> dict:
        return self.scaler.state_dict() if self.scaler is not None else {}

    def load(self, state: dict) -> None:
        if self.scaler is not None and state:
            self.scaler.load_state_dict(state)
