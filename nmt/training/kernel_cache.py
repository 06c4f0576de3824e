"""oneDNN's cache of compiled kernels, sized for training on batches of varying shapes.

On a CPU, torch runs bf16 matrix products through oneDNN, which compiles (JIT) a kernel for every new shape of a
product and keeps the last 1,024 in a cache. A training update on token-bucketed batches meets ~26 new shapes (its
(B x T) rows, its attention's (B x heads, T, S), the output layer's live rows), each ~2 ms to compile; with 1,024
kept, the cache holds about 40 updates, so an epoch never finds the shapes the previous one compiled, and the freed
kernels fragment the heap (peak memory grows epoch after epoch). With 16,384 kept, later epochs find most shapes
compiled: bench_transformer in bf16 trained 1.21x-1.34x faster in its second and third epochs, at a steady peak
memory (docs/benchmarks.md). It changes no number: the same kernels compute the same products.
"""

from __future__ import annotations

import os

CAPACITY_ENV = "ONEDNN_PRIMITIVE_CACHE_CAPACITY"
TRAINING_CAPACITY = 16384


def keep_compiled_kernels(capacity: int = TRAINING_CAPACITY) -> int:
    """Ask oneDNN to keep `capacity` compiled kernels unless the user set ONEDNN_PRIMITIVE_CACHE_CAPACITY; returns
    the capacity asked for. oneDNN reads it once, when it first compiles a kernel: call this before the process's
    first bf16 product (a process that already ran one keeps the capacity it started with)."""
    return int(os.environ.setdefault(CAPACITY_ENV, str(capacity)))
