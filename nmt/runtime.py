"""Process-wide set-up: devices, what the CPU offers, seeds, and the random generator states that exact resume
restores."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import torch

from nmt.errors import NmtError


def resolve_device(name: str, key: str = "train.device") -> torch.device:
    """auto: CUDA when available, else CPU (never MPS by itself: ask for it with mps); asking for CUDA or MPS where
    there is none is a clear error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "mps":
        mps = getattr(torch.backends, "mps", None)
        if mps is None or not mps.is_available():
            raise NmtError(f"{key}={name}: MPS (an Apple GPU) is not available on this machine; use cpu or auto")
        return device
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise NmtError(f"{key}={name}: CUDA is not available on this machine; use cpu or auto")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise NmtError(f"{key}={name}: this machine has {torch.cuda.device_count()} CUDA devices (cuda:0 ..)")
    return device


def cpu_info(field: str) -> str:
    """A field of /proc/cpuinfo's first processor ("model name", "vendor_id", ...); "" where it does not say."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.split(":", 1)[0].strip() == field:
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def cpu_has_int8(cpuinfo: str) -> bool:
    """Whether a /proc/cpuinfo text lists int8 dot-product instructions on its first CPU (x86 "flags": AVX512-VNNI,
    AVX-VNNI or AMX-INT8; ARM "Features": asimddp or i8mm), which torch's int8 matrix products need to be fast."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return bool({"avx512_vnni", "avx_vnni", "amx_int8"} & set(value.split()))
        if key.strip() == "Features":
            return bool({"asimddp", "i8mm"} & set(value.split()))
    return False


def cpu_has_bf16(cpuinfo: str) -> bool:
    """Whether a /proc/cpuinfo text lists bf16 matrix instructions (AVX512-BF16 or AMX-BF16) on its first CPU
    (x86 "flags"; on ARM "Features" with "bf16", e.g. Neoverse V1/Graviton3)."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            flags = value.split()
            return "avx512_bf16" in flags or "amx_bf16" in flags
        if key.strip() == "Features":
            return "bf16" in value.split()
    return False


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def rng_state() -> dict:
    """Python, NumPy and torch (CPU, and CUDA when in use) generator states.

    Only plain values and tensors, so a checkpoint holding them loads with `torch.load(weights_only=True)`.
    """
    numpy = np.random.get_state(legacy=False)
    state = {
        "python": random.getstate(),
        "numpy": {**numpy, "state": {"key": numpy["state"]["key"].tolist(), "pos": int(numpy["state"]["pos"])}},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    """Restore what `rng_state` returned (tensors may come back on any device)."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    numpy = state["numpy"]
    np.random.set_state(
        {**numpy, "state": {"key": np.asarray(numpy["state"]["key"], dtype=np.uint32), "pos": numpy["state"]["pos"]}}
    )
    torch.set_rng_state(state["torch"].cpu())
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])
