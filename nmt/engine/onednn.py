"""Decoding's fp32 linear layers through oneDNN, on CPUs where its product beats MKL's (what CTranslate2 does
on CPUs other than Intel's: "SGEMM backend: DNNL").

torch's F.linear multiplies fp32 matrices with MKL, whose kernels on an AMD EPYC (Zen 5, AVX-512) reach 71-87
GFLOP/s on one core, while oneDNN's reach 136-206 with the weight re-arranged once into its blocked
layout (`torch.ops.mkldnn._reorder_linear_weight`, then `_linear_pointwise`): measured 2026-12-03 on one core,
(2240, 256) x (256, 1024) 87 -> 206 GFLOP/s, (64, 256) x (256, 8000) 77 -> 191, (16, 256) x (256, 768) 71 -> 136.
On an Intel CPU without AVX-512, MKL's packed product (nmt.engine.packed) is used (`fp32_backend`).

A row's result does not depend on the other rows of its product (checked for 1 to 400 rows: a sentence gets the
same numbers alone as in any batch), but differs from MKL's in the last bits (another order of summation), so
decoding copies change in the last bits and, rarely, in an output where two tokens tie that closely.
On every AVX-512 CPU nmt's own kernel (NativeLinear, nmt.engine.native.fp32_linear) is faster still where it
counts: measured 2026-12-04 on one core of an AMD EPYC (Zen 4), 1.04x-1.7x oneDNN's product from 1 to 64 rows of
the decoder's shapes and as fast above, with no per-shape set-up (oneDNN makes and keeps a kernel for every
number of rows it meets: a fresh process pays for each new one) and the decoder's fused layer in one call; on an
Intel Xeon with AMX (2026-12-07, one core) 1.2x-2.3x MKL's product for the 8,000-word output layer from 4 to 64 rows
(0.9x at 1-2), where MKL's small-row kernels are slow (8 rows 1.04 ms against 12 rows' 0.90).
NMT_FP32_GEMM=mkl|native|onednn|torch forces a backend (torch: plain F.linear everywhere).

Shape legend: R rows (leading dims flattened), I input features, O output features.
"""

from __future__ import annotations

import functools
import os

import torch
import torch.nn.functional as F

from nmt.engine import native
from nmt.engine.packed import CopiedWeightLinear, mkl_packed
from nmt.errors import NmtError
from nmt.runtime import cpu_info

BACKENDS = ("auto", "mkl", "native", "onednn", "torch")


@functools.cache
def onednn_fp32() -> bool:
    """Whether this torch has oneDNN's fp32 linear with a pre-arranged weight (x86 and ARM builds with mkldnn)."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        weight = torch.ops.mkldnn._reorder_linear_weight(torch.ones(2, 2), None)
        out = torch.ops.mkldnn._linear_pointwise(torch.ones(1, 2), weight, None, "none", [], "")
    except (AttributeError, RuntimeError):
        return False
    return bool(torch.equal(out, torch.full((1, 2), 2.0)))


@functools.cache
def fp32_backend() -> str:
    """The product a decoding copy's fp32 linears run on a CPU: "native" (nmt's AVX-512 kernel, every linear:
    NativeLinear; every CPU with AVX-512), "mkl" (MKL's packed product, the decoder's layers; Intel CPUs without
    AVX-512), "onednn" (every linear; other CPUs) or "torch" (F.linear), from NMT_FP32_GEMM (default auto). The
    packed product's own switch, NMT_PACKED_GEMM=0, still turns "mkl" into "torch".

    Intel CPUs with AVX-512 ran on MKL's packed product until 2026-12-07; on an Intel Xeon with AMX, nmt's kernel
    measured 1.01x-1.12x MKL's in every fp32 row of bench_decode (trained t600 Transformer, greedy and beam 5,
    with and without a shortlist, 1 process x 2 threads and 2 x 1; the encoder in one native call instead of
    torch's modules: 690 against 840 ms for test2016 on one thread): docs/benchmarks.md."""
    asked = os.environ.get("NMT_FP32_GEMM", "auto").strip().lower() or "auto"
    if asked not in BACKENDS:
        raise NmtError(f"NMT_FP32_GEMM={asked}: expected one of {', '.join(BACKENDS)}")
    if asked == "auto":  # nmt's kernel wherever it is built (AVX-512); else MKL on Intel, oneDNN elsewhere
        if native.fp32():
            asked = "native"
        else:
            asked = "mkl" if cpu_info("vendor_id") == "GenuineIntel" else "onednn" if onednn_fp32() else "mkl"
    if asked == "native":
        return "native" if native.fp32() else "torch"
    if asked == "mkl":
        return "mkl" if mkl_packed() is not None else "torch"
    if asked == "onednn":
        return "onednn" if onednn_fp32() else "torch"
    return "torch"


def bucket(rows: int) -> int:
    """rows rounded up to a multiple of 8, and above 32 to one of four sizes per octave
    (64, 80, 96, 112, 128, 160, ...)."""
    step = max(8, 1 << max(rows.bit_length() - 3, 0))
    return -(-rows // step) * step


class OnednnLinear(CopiedWeightLinear):
    """An nn.Linear (the same parameters, shared: a tied output layer stays tied) whose CPU fp32 products without
    gradients run on oneDNN with its weight arranged once (re-arranged when the weight changes)."""

    def _arranged(self) -> torch.Tensor:
        return self._copy(lambda weight: torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.arrangeable(x):
            return F.linear(x, self.weight, self.bias)
        rows = x.reshape(-1, x.size(-1))  # (R, I)
        count = rows.size(0)
        if bucket(count) != count:  # few shapes: oneDNN keeps a kernel and memory for every shape it meets
            rows = F.pad(rows, (0, 0, 0, bucket(count) - count))
        bias = None if self.bias is None else self.bias.detach()
        out = torch.ops.mkldnn._linear_pointwise(rows.contiguous(), self._arranged(), bias, "none", [], "")
        return out[:count].view(*x.shape[:-1], -1)  # (R, O): the padding rows change no other row


class NativeLinear(CopiedWeightLinear):
    """An nn.Linear (the same parameters, shared) whose CPU fp32 products without gradients run on nmt's own
    AVX-512 kernel (nmt.engine.native.fp32_linear) with its weight arranged once: no per-shape set-up (oneDNN
    makes a kernel for every number of rows it meets, which a fresh process pays for at each new one), no
    operator overhead, and the fused decoder layer (native.layer_step32) on CPUs without MKL's packed product.
    Large products share torch's threads, each output computed as by one thread: the same numbers at any
    number of threads, and a row's numbers do not depend on the rows beside it."""

    def arranged(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(packed weight, padded bias): native.pack_f32's, made once per weight."""
        return self._copy(lambda weight: native.pack_f32(weight, self.bias))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not (self.arrangeable(x) and native.usable(x)):  # (no kernels: a copy made where they were)
            return F.linear(x, self.weight, self.bias)
        rows = x.reshape(-1, x.size(-1)).contiguous()  # (R, I)
        return native.fp32_linear(rows, *self.arranged(), self.out_features).view(*x.shape[:-1], -1)
