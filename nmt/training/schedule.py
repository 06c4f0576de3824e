"""Learning-rate schedules as multipliers of the peak rate `train.lr` (for torch's LambdaLR)."""

from __future__ import annotations

import math
from typing import Callable

from nmt.errors import NmtError


def inverse_sqrt(warmup: int) -> Callable[[int], float]:
    """Linear warm-up to 1 over `warmup` steps, then decay as sqrt(warmup / step) (Vaswani et al. 2017, eq. 3)."""
    warmup = max(1, warmup)
    return lambda step: min((step + 1) / warmup, math.sqrt(warmup / (step + 1)))


def constant(warmup: int) -> Callable[[int], float]:
    """Linear warm-up to 1 over `warmup` steps (none when 0), then constant."""
    return lambda step: min(1.0, (step + 1) / warmup) if warmup > 0 else 1.0


SCHEDULES = {"inverse_sqrt": inverse_sqrt, "constant": constant}


def lr_multiplier(name: str, warmup: int) -> Callable[[int], float]:
    if name not in SCHEDULES:
        raise NmtError(f"train.schedule={name}: unknown; expected one of {', '.join(SCHEDULES)}")
    return SCHEDULES[name](warmup)
