"""A decoding copy's Transformer layers as the native kernels take them: the `Layer8` / `Layer32` structs that
native.decoder_step and native.encoder_forward read (pointers into the layer's packed weights, norms and biases),
made once per layer and kept beside it (never pickled with the model).

A struct holds raw pointers, so what it is made of is kept with it: every tensor it points into (the packed
weights, each linear's scale and bias, the norms' weights and biases), so reassigning a parameter cannot free
memory the kernels still read; and `refresh` (at every encoder call and every search's `prepare`) makes the
structs again for any layer whose parameters were replaced or changed in place since (their identity and torch's
version counter).

    layer8   every linear an Int8Linear (nmt.engine.quantize) packed for VNNI: the int8 kernels
    layer32  every linear a NativeLinear (nmt's AVX-512 fp32 kernel) or every one a PackedLinear (MKL's packed
             product, called from the C through its function pointer): the fp32 kernels
    fused    the one of those a step of R rows runs on, or None

Shape legend: R rows, H model dim.
"""

from __future__ import annotations

import ctypes
import weakref

import torch
from torch import nn

from nmt.engine import native
from nmt.engine.onednn import NativeLinear
from nmt.engine.packed import PackedLinear, mkl_packed
from nmt.engine.quantize import Int8Linear
from nmt.engine.structs import Layer8, Layer32, Linear8, Linear32

FUSED_MAX_ROWS = 128  # an int8 decoding copy's step runs on the int8 kernels (where they are built with VNNI) on
# one thread, or with more threads at up to this many rows (measured 2026-12-03 for one call per layer,
# Intel Xeon with AMX, 500 test sentences, batches of 64: 1 thread greedy 1.27x, beam 5 1.11x faster than
# torch._int_mm and the kernels around it; 2 threads greedy 1.19x, beam 5 (320 rows) 0.97x unless kept to 128 rows)

_P = ctypes.c_void_p
_LAYERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # layer -> (Layer8, tensors it points into) or
# None: made at a layer's first fused step
_LAYERS32: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # the same for layer32
_PRINTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # layer -> `fingerprint` when its structs were made


def _tensors(layer: nn.Module) -> list[torch.Tensor]:
    """Every parameter and buffer of the layer's linears and norms: what its structs point into or were made from."""
    linears, norms = _layer_parts(layer)
    return [t for module in (*linears, *norms) for t in (*module.parameters(False), *module.buffers(False))]


def fingerprint(layer: nn.Module) -> tuple:
    return tuple((id(t), t._version) for t in _tensors(layer))


def refresh(layers) -> None:
    """Forget the structs of every layer whose tensors changed since they were made (a parameter replaced, or
    written in place): its next step makes them again from what the layer holds now. Once per batch, not per step."""
    for layer in layers:
        made = _PRINTS.get(layer)
        if made is not None and made != fingerprint(layer):
            for cache in (_LAYERS, _LAYERS32, _PRINTS):
                cache.pop(layer, None)
            for linear in _layer_parts(layer)[0]:
                if isinstance(linear, Int8Linear):
                    linear._vnni = None  # its VNNI pack, made from its int8 weights


def fused(layer: nn.Module, rows: int) -> tuple | None:
    """A DecoderLayer as native.decoder_step takes it for a step of `rows` rows (`layer8`, int8: single-threaded
    products, or with more threads up to FUSED_MAX_ROWS rows; else `layer32`, fp32), or None."""
    made = layer8(layer)
    if made is not None and not (rows <= FUSED_MAX_ROWS or torch.get_num_threads() == 1 or native.amx()):
        made = None
    return made or layer32(layer)


def layer8(layer: nn.Module) -> tuple[Layer8, list] | None:
    """A decoding copy's int8 DecoderLayer or EncoderLayer as the int8 kernels take it, or None where they cannot
    (no VNNI here, a linear that is not an Int8Linear of packable shape, norms without weights)."""
    made = _LAYERS.get(layer, _LAYERS)
    if made is not _LAYERS:
        return made
    made = None
    linears, norms = _layer_parts(layer)
    if native.vnni() and norms and all(type(linear) is Int8Linear for linear in linears):
        packs = [linear.native_pack() if linear.out_features % 64 == 0 else None for linear in linears]
        if all(packs):
            keep: list = [packs, linears, norms, _tensors(layer)]
            parts = [
                Linear8(
                    pack[0].data_ptr(),
                    pack[1].data_ptr(),
                    linear.scale.data_ptr(),
                    None if linear.bias is None else linear.bias.data_ptr(),
                    linear.in_features,
                    linear.out_features,
                )
                for linear, pack in zip(linears, packs)
            ]
            struct = Layer8(*_layer_head(layer, norms), *parts)
            made = (struct, keep)
    _LAYERS[layer] = made
    _PRINTS[layer] = fingerprint(layer)
    return made


def layer32(layer: nn.Module) -> tuple[Layer32, list] | None:
    """A decoding copy's fp32 DecoderLayer or EncoderLayer as the fp32 kernels take it, or None: linears all
    PackedLinear (MKL's packed product, Intel) or all NativeLinear (fp32_linear's kernel) with biases and output
    units a multiple of 64."""
    made = _LAYERS32.get(layer, _LAYERS32)
    if made is not _LAYERS32:
        return made
    made = None
    linears, norms = _layer_parts(layer)
    mkl = mkl_packed()
    if (
        norms
        and native.fp32()
        and all(
            type(linear) is NativeLinear and linear.bias is not None and linear.out_features % 64 == 0
            for linear in linears
        )
    ):
        packs = [linear.arranged() for linear in linears]
        parts = [
            Linear32(packed.data_ptr(), bias.data_ptr(), linear.in_features, linear.out_features)
            for linear, (packed, bias) in zip(linears, packs)
        ]
        struct = Layer32(*_layer_head(layer, norms), None, *parts)
        made = (struct, [packs, linears, norms, _tensors(layer)])
    elif (
        mkl is not None
        and norms
        and all(type(linear) is PackedLinear and linear.bias is not None for linear in linears)
    ):
        packs = [linear._pack(mkl) for linear in linears]
        parts = [
            Linear32(pack.data_ptr(), linear.bias.data_ptr(), linear.in_features, linear.out_features)
            for linear, pack in zip(linears, packs)
        ]
        struct = Layer32(*_layer_head(layer, norms), ctypes.cast(mkl.cblas_sgemm_compute, _P).value, *parts)
        made = (struct, [packs, linears, norms, _tensors(layer)])
    _LAYERS32[layer] = made
    _PRINTS[layer] = fingerprint(layer)
    return made


def _layer_parts(layer: nn.Module) -> tuple[list, list]:
    """A DecoderLayer's six linears in the kernels' order and its three norms; no norms where the layer is not
    the one the kernels compute (a feed-forward other than linear-ReLU-dropout-linear, norms without weights).
    An EncoderLayer (`encoder_forward`) has no cross-attention: its places hold the self-attention's output
    projection and norm, which encoder_body never reads."""
    attn, ffn = _self_attention(layer), layer.ffn
    if hasattr(layer, "cross_attn"):
        cross, norms = layer.cross_attn, [layer.res_self.norm, layer.res_cross.norm, layer.res_ffn.norm]
        cross_linears = [cross.q_proj, cross.out_proj]
    else:
        norms, cross_linears = [layer.res_attn.norm, layer.res_attn.norm, layer.res_ffn.norm], [attn.out_proj] * 2
    if len(ffn) != 4 or type(ffn[1]) is not nn.ReLU or any(n.weight is None or n.bias is None for n in norms):
        return [], []
    linears = [getattr(attn, "qkv_proj", None), attn.out_proj, *cross_linears, ffn[0], ffn[-1]]
    return linears, norms


def _self_attention(layer: nn.Module) -> nn.Module:
    return layer.self_attn if hasattr(layer, "self_attn") else layer.attn


def _layer_head(layer: nn.Module, norms: list) -> tuple:
    """Layer8's and Layer32's first fields: sizes, norms, attention scales (1 where the query projection carries
    the factor: `DecodingAttention.prescale`)."""
    attn = _self_attention(layer)
    cross = getattr(layer, "cross_attn", attn)
    return (
        attn.heads * attn.head_dim,
        attn.heads,
        attn.head_dim,
        int((layer.res_self if hasattr(layer, "res_self") else layer.res_attn).pre),
        (_P * 3)(*(n.weight.data_ptr() for n in norms)),
        (_P * 3)(*(n.bias.data_ptr() for n in norms)),
        (ctypes.c_float * 3)(*(n.eps for n in norms)),
        attn.scale,
        cross.scale,
    )


def native_norm(norm: nn.Module) -> tuple[torch.Tensor, torch.Tensor, float] | None | bool:
    """A final norm as the native whole-stack calls take it: (weight, bias, eps) for a LayerNorm with both, None for
    none (post-norm's Identity), False where they cannot."""
    if isinstance(norm, nn.Identity):
        return None
    if isinstance(norm, nn.LayerNorm) and norm.weight is not None and norm.bias is not None:
        return norm.weight, norm.bias, norm.eps
    return False
