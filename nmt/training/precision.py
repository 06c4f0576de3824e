"""Numeric precision of training: fp32, bf16 autocast, or fp16 autocast with a gradient scaler (CUDA only).

bf16 and fp16 run the forward pass and the loss under `torch.autocast`: matrix products in the lower
precision, while the weights, their gradients and Adam's moments stay fp32 (the "master weights").
fp16's narrow exponent needs the loss scaled up before backward and the gradients scaled back before
clipping (`torch.amp.GradScaler`); bf16 has fp32's exponent and needs no scaler. `auto` picks bf16 where
the hardware multiplies bf16 natively (a CUDA GPU that supports it; a CPU with AVX512-BF16 or AMX) and
fp32 elsewhere, where bf16 would be emulated and slower than fp32.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext

import torch

from nmt.errors import NmtError
from nmt.runtime import cpu_has_bf16, cpu_has_int8

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def native_bf16(device: torch.device) -> bool:
    """Whether `device` multiplies bf16 matrices in hardware."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type != "cpu":
        return False
    try:
        with open("/proc/cpuinfo") as f:
            return cpu_has_bf16(f.read())
    except OSError:  # not Linux: no cheap way to tell, so stay exact
        return False


def slow_decode_precision(precision: str, device: torch.device) -> str | None:
    """A warning when decode.precision would be slower than fp32 on this CPU (None when it is not, or cannot be
    told): without VNNI, torch's int8 products run about 20x slower than fp32 (2026-12-02, AMD EPYC with AVX2
    only: 201 ms against 8.8 ms for a (64, 256) x (256, 8000) product, 1 thread); without AVX512-BF16/AMX, bf16 is
    emulated (43 ms there)."""
    if device.type != "cpu" or precision not in ("int8", "bf16"):
        return None
    try:
        with open("/proc/cpuinfo") as f:
            info = f.read()
    except OSError:
        return None
    if precision == "int8" and not cpu_has_int8(info):
        return (
            "decode.precision=int8: this CPU has no int8 dot-product instructions (VNNI); torch's int8 products run "
            "about 20x slower than fp32 here; use decode.precision=fp32"
        )
    if precision == "bf16" and not cpu_has_bf16(info):
        return (
            "decode.precision=bf16: this CPU has no bf16 matrix instructions (AVX512-BF16/AMX); bf16 is emulated, "
            "about 5x slower than fp32 here; use decode.precision=fp32"
        )
    return None


def resolve_precision(name: str, device: torch.device) -> str:
    """`auto` -> bf16 or fp32 for this device; any other name as given."""
    if name == "auto":
        return "bf16" if native_bf16(device) else "fp32"
    return name


def check_bf16(name: str, device: torch.device, key: str) -> None:
    """bf16 on a GPU that has no bf16 arithmetic (before compute capability 8.0, e.g. a V100 or T4) is refused:
    PyTorch would emulate it, slowly, where fp16 is the GPU's own."""
    if name == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise NmtError(
            f"{key}=bf16: this GPU has no bf16 arithmetic (compute capability below 8.0); use fp16 or fp32 there"
        )


class Precision:
    """Autocast for the forward pass, and the gradient scaler's hooks around backward and the optimizer step."""

    def __init__(self, name: str, device: torch.device):
        name = resolve_precision(name, device)
        if name == "fp16" and device.type != "cuda":
            raise NmtError(f"train.precision=fp16: needs a CUDA device (training on {device.type}); use bf16 on a CPU")
        check_bf16(name, device, "train.precision")
        self.name, self.device = name, device
        self.scaler = torch.amp.GradScaler(device.type) if name == "fp16" else None

    def autocast(self) -> AbstractContextManager:
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
