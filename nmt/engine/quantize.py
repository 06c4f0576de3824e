"""Decoding in reduced precision (decode.precision): the model's linear layers in bf16 or int8.

    bf16  y = x W^T + b with x, W, b rounded to bfloat16 (AVX512-BF16 / AMX matrix products on recent
          x86 CPUs), the product accumulated in fp32 and returned as fp32, so everything between the
          linear layers (attention, norms, the residual stream, the search) stays fp32.
    int8  y = (q(x) q(W)^T) * s_x * s_W + b, the product in int32 (torch._int_mm; VNNI on x86):
          q(W) = round(W / s_W), s_W = max|W_i| / 127, one scale per output unit (per channel);
          q(x) = round(x / s_x), s_x = max|x_r| / 127, one scale per row, computed at every call
          (dynamic, per token). The scheme of LLM.int8() (Dettmers et al. 2022) without its outlier
          split, and of torchao's int8 dynamic-activation config; torch.ao's quantize_dynamic is
          deprecated and scales activations per tensor.
          Where nmt's native kernels are built with VNNI (nmt.engine.native: AVX-512 VNNI or AMX), every int8
          linear runs in one call of native.vnni_linear at any number of rows, the same numbers as torch._int_mm's
          chain (measured 2026-12-04 on one core of an AMD EPYC, Zen 4, its 6-row blocks: 1.1x-1.8x that chain
          and 1.1x-1.6x oneDNN's int8 product from 8 to 960 rows of the Transformer's shapes, with none of the
          ~1 ms oneDNN spends making a kernel for each new number of rows; on AMX tiles, Intel Xeon 4th
          generation on, 2.3x-4.3x). Elsewhere a layer of at least ONEDNN_MIN_OUT outputs (the output layer over
          the vocabulary) runs on a CPU through oneDNN's int8 product (`onednn_linear`, VNNI kernels with
          pre-packed weights, 1.7x to 2.6x faster than torch._int_mm there: the same per-row scales on another
          grid (255 levels), so its results differ), and smaller ones on torch._int_mm.
Everything else (embeddings, layer norms, GRU/LSTM cells, the RNN attention scorers, whose weights
some scores read directly) stays fp32. Training never sees these modules: they replace a trained
model's layers in its decoding copy only (`convert_linears`, called by nmt.engine.decoding_copy).

Shape legend: R rows (any leading dims flattened), I input features, O output features.
"""

from __future__ import annotations

import functools
import warnings

import torch
import torch.nn.functional as F
from torch import nn

from nmt.engine import native
from nmt.engine.onednn import NativeLinear, OnednnLinear, bucket, fp32_backend
from nmt.engine.packed import PackedLinear
from nmt.models.attention import Attention
from nmt.runtime import cpu_has_int8

PRECISIONS = ("fp32", "bf16", "int8")


class Bf16Linear(nn.Module):
    """A Linear whose weights and product are bfloat16, between fp32 inputs and outputs.

    oneDNN, which runs bf16 products on a CPU, keeps some memory for every shape it has seen (about
    0.7 MB each here, not freed), and decoding meets a new row count at almost every batch and step; the
    rows are padded up to a `bucket` so that few shapes ever occur.
    """

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.register_buffer("weight", linear.weight.detach().to(torch.bfloat16))
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().to(torch.bfloat16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.size(-1)).to(torch.bfloat16)  # (R, I)
        count = rows.size(0)
        if bucket(count) != count:
            rows = F.pad(rows, (0, 0, 0, bucket(count) - count))
        return F.linear(rows, self.weight, self.bias)[:count].float().view(*x.shape[:-1], -1)

    def rows(self, index: torch.Tensor) -> Bf16Linear:
        """This layer cut to the output units `index` (a vocabulary shortlist)."""
        cut = Bf16Linear.__new__(Bf16Linear)
        nn.Module.__init__(cut)
        cut.in_features, cut.out_features = self.in_features, index.numel()
        cut.register_buffer("weight", self.weight.index_select(0, index))
        cut.register_buffer("bias", None if self.bias is None else self.bias.index_select(0, index))
        return cut


def int_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a (R, I) int8 @ b (I, O) int8 -> (R, O) int32 through torch._int_mm. On CUDA its kernel needs more than 16
    rows and I and O multiples of 8: the operands are padded with zeros there (which add nothing to any product)
    and the result cut back. A CPU takes any shape as it is."""
    if not a.is_cuda:
        return torch._int_mm(a, b)
    return padded_int_mm(a, b)


def padded_int_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    rows, inner = a.shape
    out = b.size(1)
    rows_p, inner_p, out_p = max(32, -(-rows // 8) * 8), -(-inner // 8) * 8, -(-out // 8) * 8
    if (rows_p, inner_p) != (rows, inner):
        a = F.pad(a, (0, inner_p - inner, 0, rows_p - rows))
    if (inner_p, out_p) != (inner, out):
        b = F.pad(b, (0, out_p - out, 0, inner_p - inner))
    return torch._int_mm(a, b)[:rows, :out]


ONEDNN_MIN_OUT = 4096  # layers with this many outputs or more use oneDNN's int8 product on a CPU (measured:
# 2026-12-02, Intel Xeon with AMX, one thread, rows 1 to 320: (R, 256) x (256, 8000) 1.2x to 2.6x faster than
# torch._int_mm with the quantisation around it; (R, 256) x (256, 256 | 1024) and (R, 1024) x (1024, 256) 0.7x
# to 1.0x, so not for those)


@functools.cache
def onednn_int8() -> bool:
    """Whether oneDNN's int8 product is usable here: this torch has its quantized engine (x86 builds) and the CPU has
    int8 dot products (VNNI/AMX). Without them oneDNN multiplies u8 by s8 with AVX2's vpmaddubsw, whose 16-bit pair
    sums saturate: rows of large values came out ~20% off (2026-12-06, AMD EPYC Zen 3, AVX2 only)."""
    if "onednn" not in torch.backends.quantized.supported_engines:
        return False
    try:
        with open("/proc/cpuinfo") as f:
            return cpu_has_int8(f.read())
    except OSError:
        return False


def pack_onednn(weight_t: torch.Tensor, scale: torch.Tensor) -> torch.ScriptObject | None:
    """int8 weights (I, O) with a scale per output unit, packed for oneDNN's int8 product (no bias); None where
    this torch cannot (torch 2.13 warns that its quantized tensors will go: then torch._int_mm serves)."""
    engine = torch.backends.quantized.engine
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # the deprecation of quantized tensors, said above
            q = torch._make_per_channel_quantized_tensor(
                weight_t.t().contiguous(), scale.double(), torch.zeros_like(scale, dtype=torch.long), 0
            )
            torch.backends.quantized.engine = "onednn"
            return torch.ops.quantized.linear_prepack(q, None)
    except (AttributeError, RuntimeError):
        return None
    finally:
        torch.backends.quantized.engine = engine


def onednn_linear(rows: torch.Tensor, packed: torch.ScriptObject, bias: torch.Tensor | None) -> torch.Tensor:
    """rows (R, I) fp32 -> (R, O) through oneDNN's int8 product, with the per-row input scale of Int8Linear.

    oneDNN quantizes its input with one range for the whole tensor, which would tie a row's result to the other
    rows of its batch. So each row is divided by its largest |value| (its scale), putting every value in
    [-1, 1], and a pinned row holding -1 and 1 is added: the tensor's range is then always [-1, 1], the same for
    every batch, and a sentence gets the same result alone as in any batch. The int32 products are exact;
    the result is multiplied back by each row's scale.
    """
    if native.usable(rows) and rows.is_contiguous():
        unit, scale = native.unit_rows_pinned(rows)  # the same numbers in one pass
    else:
        scale = rows.abs().amax(1, keepdim=True).clamp_min_(1e-12)  # (R, 1)
        unit = torch.cat([rows / scale, pinned_row(rows)])
    product = torch.ops.quantized.linear_dynamic(unit, packed, False)[:-1]
    return product.mul_(scale) if bias is None else torch.addcmul(bias, product, scale)  # (R, O)


_PINS: dict[tuple, torch.Tensor] = {}  # onednn_linear's pinned rows by (width, dtype, device), made once


def pinned_row(rows: torch.Tensor) -> torch.Tensor:
    """(1, I): 1 first, -1 last, zeros between (never written: shared by every call)."""
    key = (rows.size(1), rows.dtype, rows.device)
    if key not in _PINS:
        pin = rows.new_zeros(1, rows.size(1))
        pin[0, 0], pin[0, -1] = 1.0, -1.0
        _PINS[key] = pin
    return _PINS[key]


class Int8Linear(nn.Module):
    """A Linear with int8 weights (a scale per output unit) and int8 inputs (a scale per row, at run time)."""

    _cut = False  # a shortlist's cut of an output layer (`rows`)

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        weight = linear.weight.detach().float()  # (O, I)
        scale = weight.abs().amax(1).clamp_min(1e-12) / 127  # (O,)
        self.register_buffer("weight_t", (weight / scale[:, None]).round().to(torch.int8).t().contiguous())  # (I, O)
        self.register_buffer("scale", scale)
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().float())
        self._packed: torch.ScriptObject | bool | None = None  # oneDNN's packed weights, made at the first
        # product (False: this torch cannot)
        self._vnni: tuple[torch.Tensor, ...] | bool | None = None  # `native_pack`'s, at the first native
        # product (False: not here)
        self._by_row: tuple[torch.Tensor, torch.Tensor] | None = None  # (O, I) weights and column sums, made
        # by the first `rows` (a shortlist's cuts gather rows of it)

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_packed"] = None  # packed weights do not pickle; each process packs its own
        state["_vnni"] = None
        state["_by_row"] = None
        return state

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.size(-1))  # (R, I)
        if rows.dtype != torch.float32:
            rows = rows.float()
        native_rows = native.usable(rows) and rows.is_contiguous()
        if native_rows and self.native_pack():  # VNNI or AMX: one call at any number of rows, the same numbers
            # as below (int_mm's), faster than oneDNN and torch._int_mm's chain at every shape measured
            return self._native(rows).view(*x.shape[:-1], -1)
        if self.out_features >= ONEDNN_MIN_OUT and not rows.is_cuda and self._packed is not False:
            if self._packed is None:
                packed = pack_onednn(self.weight_t, self.scale) if onednn_int8() else None
                self._packed = False if packed is None else packed
            if self._packed is not False:
                return onednn_linear(rows, self._packed, self.bias).view(*x.shape[:-1], -1)
        if native_rows:  # the same numbers in two passes instead of nine operators
            q, scale = native.quantize_rows(rows)
            return native.dequantize(int_mm(q, self.weight_t), scale, self.scale, self.bias).view(*x.shape[:-1], -1)
        scale = rows.abs().amax(1, keepdim=True).clamp_min_(1e-12).div_(127)  # (R, 1)
        product = int_mm((rows / scale).round_().to(torch.int8), self.weight_t)  # (R, O) int32
        y = torch.mul(product, scale)  # (R, O) float: the int32 converted and multiplied in one pass
        y = y.mul_(self.scale)  # (not addcmul for the bias: its fused multiply-add rounds differently)
        if self.bias is not None:
            y = y.add_(self.bias)
        return y.view(*x.shape[:-1], -1)

    def native_pack(self) -> tuple[torch.Tensor, ...] | bool:
        """(packed weight, column sums, scale, bias) for native.vnni_linear, the output units padded with zeros to
        a multiple of 64 (a shortlist's cut layer); False where the kernel cannot take this layer. Made once."""
        if self._vnni is None:
            pad = native.padded(self.out_features) - self.out_features
            pack = native.pack_vnni(F.pad(self.weight_t, (0, pad)))
            bias = None if self.bias is None else F.pad(self.bias, (0, pad))
            self._vnni = False if pack is None else (*pack, F.pad(self.scale, (0, pad), value=1.0), bias)
        return self._vnni

    def _native(self, rows: torch.Tensor) -> torch.Tensor:
        y = native.vnni_linear(rows, *self.native_pack())  # (R, O rounded up to 64)
        return y if y.size(1) == self.out_features else y[:, : self.out_features].contiguous()

    def rows(self, index: torch.Tensor) -> Int8Linear:
        """This layer cut to the output units `index` (a vocabulary shortlist), made for every batch: its weights
        are gathered as rows of an (O, I) copy and arranged for the native kernel from those (gathering ~1,800
        columns of weight_t (I, O) and arranging them took 2.1 ms per batch on a Zen 4 core, 0.5 ms so).

        On the native kernel the cut has whole blocks of 64 outputs: the ones after index's are -inf (zero weights,
        a -inf bias: no token), so that a step's logits are the kernel's output as it is; copying them out of its
        padded rows at every step cost ~1.3% of a greedy int8 search. `Shortlisted` takes the cut's width."""
        cut = Int8Linear.__new__(Int8Linear)
        nn.Module.__init__(cut)
        if self._by_row is None:
            self._by_row = (self.weight_t.t().contiguous(), self.weight_t.sum(0, dtype=torch.int32))
        by_row, colsum = self._by_row
        weight = by_row.index_select(0, index)  # (W, I)
        scale, sums = self.scale.index_select(0, index), colsum.index_select(0, index)
        bias = None if self.bias is None else self.bias.index_select(0, index)
        inner, out = self.in_features, index.numel()
        cut._packed = cut._vnni = cut._by_row = None
        cut._cut = True  # an output layer: on the native kernel at any number of rows, as the whole one
        vnni = native.vnni() and inner % 4 == 0 and inner <= 4096 and not weight.is_cuda  # pack_vnni's layout
        pad = native.padded(out) - out if vnni else 0
        if pad:
            weight, sums = F.pad(weight, (0, 0, 0, pad)), F.pad(sums, (0, pad))
            scale = F.pad(scale, (0, pad), value=1.0)
            bias = F.pad(scale.new_zeros(out) if bias is None else bias, (0, pad), value=float("-inf"))
        cut.in_features, cut.out_features = inner, out + pad
        cut.register_buffer("weight_t", weight.t())  # (I, W), a view: what the other products take
        cut.register_buffer("scale", scale)
        cut.register_buffer("bias", bias)
        if vnni:
            packed = weight.view(-1, 16, inner // 4, 4).permute(0, 2, 1, 3).contiguous()
            cut._vnni = (packed, sums, scale, bias)
        return cut


LINEARS: dict[str, type[nn.Module]] = {"bf16": Bf16Linear, "int8": Int8Linear}


def convert_linears(model: nn.Module, precision: str) -> None:
    """Every nn.Linear of `model` outside the attention scorers (whose weights some scores read directly) replaced,
    in place, by its `precision` version; fp32 on a CPU: the decoder's on MKL's packed product (nmt.engine.packed),
    or all of them on oneDNN's or nmt's own kernel (nmt.engine.onednn), whichever `fp32_backend` says."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision}: expected one of {', '.join(PRECISIONS)}")
    if precision != "fp32":
        _replace_linears(model, LINEARS[precision])
    elif fp32_backend() in ("onednn", "native"):
        _replace_linears(model, OnednnLinear if fp32_backend() == "onednn" else NativeLinear)
    elif isinstance(getattr(model, "decoder", None), nn.Module) and fp32_backend() == "mkl":
        _replace_linears(model.decoder, PackedLinear)


def _replace_linears(module: nn.Module, make: type[nn.Module]) -> None:
    for name, child in module.named_children():
        if isinstance(child, Attention):
            continue
        if type(child) is nn.Linear:
            setattr(module, name, make(child))
        else:
            _replace_linears(child, make)
