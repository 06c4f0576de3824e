"""Decoding's fp32 linear layers on a CPU through MKL's packed matrix product (what CTranslate2's
"SGEMM backend: MKL (packed: true)" does).

A product x W^T of a decoding step has few rows (a batch's hypotheses) against a weight that stays the same
for the whole search. torch's F.linear calls MKL's sgemm, which re-arranges the weight into its kernel's
block layout at every call; `cblas_sgemm_pack` does that once, and `cblas_sgemm_compute` then multiplies
any number of rows by the packed weight. Measured on one core of an Intel Xeon (AVX-512, scripts in the
note of issue 30): 1.15x-1.3x for 64 rows, 1.4x-1.7x for 16, up to 2.4x for the 8,000-word output layer at
8-10 rows; below `MIN_ROWS` rows the plain product is as fast or faster, so those stay on F.linear. For
rows >= MIN_ROWS and an inner dimension of 256 the outputs are bit-identical to F.linear's (the same kernel,
with the bias as the product's C and beta 1, as addmm does); other shapes differ in the last bits.

The MKL inside torch's own library is called (through ctypes, which releases the GIL); where torch has no
MKL (ARM, macOS wheels) or the input is not an fp32 CPU tensor, or gradients are wanted, the layer is an
ordinary nn.Linear. The packed copy is made at the first product, remade when the weight changes, and not
pickled (each process of a SearchPool packs its own).
"""

from __future__ import annotations

import ctypes
import functools
import os

import torch
import torch.nn.functional as F
from torch import nn

MIN_ROWS = 12  # fewer rows: F.linear (as fast, and bit-identical results)

_ROW_MAJOR, _NO_TRANS, _TRANS, _PACKED, _B_MATRIX = 101, 111, 112, 151, 162  # MKL's CBLAS enums


@functools.cache
def mkl_packed() -> ctypes.CDLL | None:
    """torch's library with MKL's packed sgemm functions typed, or None where this torch has none."""
    if not torch.backends.mkl.is_available() or os.environ.get("NMT_PACKED_GEMM", "1") == "0":
        return None
    try:
        lib = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so"))
        get_size, pack, compute = lib.cblas_sgemm_pack_get_size, lib.cblas_sgemm_pack, lib.cblas_sgemm_compute
    except (OSError, AttributeError):
        return None
    i64, ptr, c_int = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
    get_size.restype = ctypes.c_size_t
    get_size.argtypes = [c_int, i64, i64, i64]
    pack.restype = None
    pack.argtypes = [c_int, c_int, c_int, i64, i64, i64, ctypes.c_float, ptr, i64, ptr]
    compute.restype = None
    compute.argtypes = [c_int, c_int, c_int, i64, i64, i64, ptr, i64, ptr, i64, ctypes.c_float, ptr, i64]
    return lib


def _version(tensor: torch.Tensor) -> int:
    """The tensor's in-place change counter; an inference tensor (made under torch.inference_mode) keeps none."""
    try:
        return tensor._version
    except RuntimeError:
        return -1


class CopiedWeightLinear(nn.Linear):
    """An nn.Linear sharing another's parameters (a tied output layer stays tied) that keeps a copy of its weight in
    some product's own layout, made at the first product and remade when the weight changes (`_copy`); the copy is
    not pickled (each process of a SearchPool makes its own)."""

    def __init__(self, linear: nn.Linear):
        nn.Module.__init__(self)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        self._packed: tuple[tuple, torch.Tensor] | None = None  # (the weight's identity when copied, the copy)

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_packed"] = None
        return state

    def arrangeable(self, x: torch.Tensor) -> bool:
        """Whether a product with x may use the copy: fp32 on the CPU, no gradients wanted."""
        return (
            x.device.type == "cpu"
            and x.dtype == torch.float32
            and self.weight.dtype == torch.float32
            and not (torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad))
        )

    def rows(self, index: torch.Tensor) -> CopiedWeightLinear:
        """This layer cut to the output units `index` (a vocabulary shortlist), its copy made at its first product."""
        cut = type(self).__new__(type(self))
        nn.Module.__init__(cut)
        cut.in_features, cut.out_features = self.in_features, index.numel()
        cut.weight = self.weight.detach().index_select(0, index)  # plain tensors: no gradients, not trained
        cut.bias = None if self.bias is None else self.bias.detach().index_select(0, index)
        cut._packed = None
        return cut

    def _copy(self, make) -> torch.Tensor:
        """The weight's copy, make(weight) when there is none for the weight as it is now."""
        weight = self.weight
        key = (weight.data_ptr(), _version(weight), tuple(weight.shape))
        if self._packed is None or self._packed[0] != key:
            self._packed = (key, make(weight))
        return self._packed[1]


class PackedLinear(CopiedWeightLinear):
    """An nn.Linear whose CPU fp32 products of at least MIN_ROWS rows run on MKL's packed weight."""

    def _pack(self, lib: ctypes.CDLL) -> torch.Tensor:
        def pack(weight: torch.Tensor) -> torch.Tensor:
            w = weight.detach().contiguous()  # (O, I): B = W^T, read transposed
            out, inner = self.out_features, self.in_features
            size = lib.cblas_sgemm_pack_get_size(_B_MATRIX, 64, out, inner)
            buffer = torch.empty(size + 64, dtype=torch.uint8)  # MKL reports more than it writes: pages left untouched
            lib.cblas_sgemm_pack(
                _ROW_MAJOR, _B_MATRIX, _TRANS, 64, out, inner, 1.0, w.data_ptr(), inner, buffer.data_ptr()
            )
            return buffer

        return self._copy(pack)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.numel() < MIN_ROWS * self.in_features:  # few rows (a search's last steps): no checks to pay for
            return F.linear(x, self.weight, self.bias)
        lib = mkl_packed()
        if (
            lib is None
            or x.device.type != "cpu"
            or x.dtype != torch.float32
            or self.weight.dtype != torch.float32
            or self.weight.device.type != "cpu"
            or (torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad))
        ):
            return F.linear(x, self.weight, self.bias)
        rows = x.reshape(-1, self.in_features)  # (R, I)
        if rows.size(0) < MIN_ROWS:
            return F.linear(x, self.weight, self.bias)
        rows = rows.contiguous()
        count, out = rows.size(0), self.out_features
        packed = self._pack(lib)
        if self.bias is None:
            y, beta = torch.empty(count, out), 0.0
        else:
            y, beta = self.bias.detach().expand(count, out).contiguous(), 1.0  # C = bias, then C += x W^T
        lib.cblas_sgemm_compute(
            _ROW_MAJOR,
            _NO_TRANS,
            _PACKED,
            count,
            out,
            self.in_features,
            rows.data_ptr(),
            self.in_features,
            packed.data_ptr(),
            self.in_features,
            beta,
            y.data_ptr(),
            out,
        )
        return y.view(*x.shape[:-1], out)
