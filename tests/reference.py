"""Helpers for the reference tests: fixed weights (no RNG), writing them into a model, softmax by hand.

The reference computations in tests/test_reference_*.py are plain tensor arithmetic written from the
papers' equations; they read weights from here, never call the model's modules.
"""

from __future__ import annotations

import math

import torch


def fixed(*shape: int, seed: int, scale: float = 0.8) -> torch.Tensor:
    """Fixed weights, the same on every machine and torch version: entry k is scale * sin(1.37 k + seed)."""
    return scale * torch.sin(torch.arange(math.prod(shape), dtype=torch.float32) * 1.37 + seed).view(shape)


def set_params(module: torch.nn.Module, values: dict[str, torch.Tensor]) -> None:
    """Copy each value into the parameter of that name (shapes must match exactly)."""
    with torch.no_grad():
        for name, value in values.items():
            param = module.get_parameter(name)
            assert param.shape == value.shape, (name, param.shape, value.shape)
            param.copy_(value)


def sigmoid(x: torch.Tensor) -> torch.Tensor:
    return 1 / (1 + torch.exp(-x))


def softmax_over(scores: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """a_s = exp(e_s) / sum_{s' allowed} exp(e_s'), and 0 where not allowed; `allowed` broadcasts to scores."""
    allowed = allowed.expand_as(scores)
    top = scores.masked_fill(~allowed, float("-inf")).amax(-1, keepdim=True)
    e = torch.where(allowed, torch.exp(scores - top), torch.zeros_like(scores))
    return e / e.sum(-1, keepdim=True)
