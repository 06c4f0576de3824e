"""Process-wide set-up: devices and seeds."""

from __future__ import annotations

import random

import numpy as np
import torch


def resolve_device(name: str) -> torch.device:
    """auto: CUDA when available, else CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
