"""The structs the native kernels take (csrc/kernels.h: Linear8, Layer8, Linear32, Layer32) as ctypes copies, and
their layout as nmt_layout reports it: nmt.engine.build compares the two when it loads the library and disables the
kernels where they differ (a field out of place would be read as another: silent memory corruption)."""

from __future__ import annotations

import ctypes

_I64 = ctypes.c_int64
_P = ctypes.c_void_p


class Linear8(ctypes.Structure):
    _fields_ = [("packed", _P), ("colsum", _P), ("scale", _P), ("bias", _P), ("inner", _I64), ("out", _I64)]


class Layer8(ctypes.Structure):
    _fields_ = [
        ("dim", _I64),
        ("heads", _I64),
        ("head_dim", _I64),
        ("pre", _I64),
        ("norm_w", _P * 3),
        ("norm_b", _P * 3),
        ("eps", ctypes.c_float * 3),
        ("self_scale", ctypes.c_float),
        ("cross_scale", ctypes.c_float),
        *((name, Linear8) for name in ("qkv", "self_out", "cross_q", "cross_out", "ffn_in", "ffn_out")),
    ]


class Linear32(ctypes.Structure):
    _fields_ = [("packed", _P), ("bias", _P), ("inner", _I64), ("out", _I64)]


class Layer32(ctypes.Structure):
    _fields_ = [
        *Layer8._fields_[:9],
        ("compute", _P),
        *((name, Linear32) for name in ("qkv", "self_out", "cross_q", "cross_out", "ffn_in", "ffn_out")),
    ]


_HEAD = ["dim", "heads", "head_dim", "pre", "norm_w", "norm_b", "eps", "self_scale", "cross_scale"]
_LINEARS = ["qkv", "self_out", "cross_q", "cross_out", "ffn_in", "ffn_out"]
LAYOUT: list[tuple[type[ctypes.Structure], list[str]]] = [  # the order of nmt_layout in csrc/kernels.c
    (Linear8, ["packed", "colsum", "scale", "bias", "inner", "out"]),
    (Layer8, [*_HEAD, *_LINEARS]),
    (Linear32, ["packed", "bias", "inner", "out"]),
    (Layer32, [*_HEAD, "compute", *_LINEARS]),
]
