"""Learning-rate schedules as multipliers of the peak rate `train.lr` (for torch's LambdaLR)."""

from __future__ import annotations

import math
from collections.abc import Callable

from nmt.errors import NmtError


def inverse_sqrt(warmup: int) -> Callable[[int], float]:
    """Linear warm-up to 1 over `warmup` steps, then decay as sqrt(warmup / step) (Vaswani et al. 2017, eq. 3)."""
    warmup = max(1, warmup)
    return lambda step: min((step + 1) / warmup, math.sqrt(warmup / (step + 1)))


def constant(warmup: int) -> Callable[[int], float]:
    """Linear warm-up to 1 over `warmup` steps (none when 0), then constant."""
    return lambda step: min(1.0, (step + 1) / warmup) if warmup > 0 else 1.0


def cosine(warmup: int, total: int) -> Callable[[int], float]:
    """Linear warm-up to 1 over `warmup` steps, then half a cosine down to 0 at update `total` (train.max_steps).

    Loshchilov & Hutter 2017 without restarts: the rate reaches zero when the run ends, so the last checkpoints
    settle instead of staying noisy as with inverse_sqrt's long tail."""
    warmup = max(0, min(warmup, total - 1))

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        done = min(1.0, (step + 1 - warmup) / max(1, total - warmup))
        return 0.5 * (1.0 + math.cos(math.pi * done))

    return factor


# name -> multiplier for (warm-up updates, the run's updates); only cosine needs the run's length
SCHEDULES: dict[str, Callable[[int, int], Callable[[int], float]]] = {
    "inverse_sqrt": lambda warmup, total: inverse_sqrt(warmup),
    "constant": lambda warmup, total: constant(warmup),
    "cosine": cosine,
}


def lr_multiplier(name: str, warmup: int, total: int) -> Callable[[int], float]:
    """The multiplier of schedule `name` for `warmup` warm-up updates in a run of `total` updates (train.max_steps)."""
    if name not in SCHEDULES:
        raise NmtError(f"train.schedule={name}: unknown; expected one of {', '.join(SCHEDULES)}")
    return SCHEDULES[name](warmup, total)
