"""Small fused CPU kernels for decoding, compiled from C on first use (gcc or cc) and called through ctypes.

A decoder step of a few rows spends much of its time in torch's per-operator overhead, not in arithmetic: an int8
linear quantizes its input with six operators (abs, amax, clamp, divide, round, convert) and scales its product
back with three, and torch._int_mm costs 7-25 us whatever the rows; a step's attention is a dozen operators
around two batched products of tiny matrices. The kernels here:

    quantize_rows, dequantize, unit_rows_pinned   Int8Linear's chains around its product, one pass each
    vnni_linear                                   all of Int8Linear for a few rows (AVX-512 VNNI), one call
    attend, self_attend                           a step's cross- and self-attention (the latter writing its
                                                  key and value into the cache), one call each

The int8 ones compute the same float operations in the same order as the torch chains they replace (IEEE
division, round half to even, no fused multiply-add: `-ffp-contract=off`, no `-ffast-math`; the int32 products are
exact), so their results are the same bit for bit; the attention ones sum in another order and use their own exp
(within 2 ulp), so they differ from torch's in the last bits, as any other kernel would (tests/test_native.py).
Each computes a row from that row alone: a sentence's result does not depend on its batch.

The C lives in csrc/ (kernels.c, kernels.h); nmt.engine.build compiles, caches, checks and loads it. Where no
compiler is found, the build fails, the cache folder is refused or NMT_NATIVE=0 is set, `library()` is None and
callers use their torch operators: the kernels are a speed-up, never a requirement. Every wrapper here checks
what it passes (dtype, device, contiguity, shapes, index bounds: `need`, `fail`) before a pointer crosses into C,
and bounds such as top-k's k are checked again inside the C.

Shape legend: R rows, I input features, O output features.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from nmt.engine.build import _compiler, build, describe, library  # noqa: F401 (the kernels' library, re-exported)
from nmt.engine.structs import Layer8, Layer32, Linear8, Linear32  # noqa: F401 (re-exported)

_I64 = ctypes.c_int64
_P = ctypes.c_void_p
TOPK_MAX = 64  # NMT_TOPK_MAX of csrc/kernels.h
NO_MEMORY, OUT_OF_BOUNDS, BAD_TOKEN = -2, -3, -1  # the kernels' return codes (csrc/kernels.h)


def _shape(t: torch.Tensor) -> str:
    return f"{str(t.dtype).removeprefix('torch.')} {tuple(t.shape)} strides {t.stride()} on {t.device}"


def need(
    function: str,
    name: str,
    t: torch.Tensor,
    dtype: torch.dtype = torch.float32,
    dims: int | None = None,
    contiguous: bool = True,
) -> torch.Tensor:
    """t as a kernel may read it: a CPU tensor of `dtype` with `dims` dimensions, contiguous (or, contiguous=False,
    its last dimension contiguous); else a ValueError that names the kernel, the argument and what it got. No
    pointer crosses into C unchecked: an expanded tensor (stride 0) or a view with gaps would be read out of
    bounds."""
    if (  # the fast path first: called for every tensor of every decoding step
        isinstance(t, torch.Tensor)
        and t.is_cpu
        and t.dtype is dtype
        and (dims is None or t.dim() == dims)
        and (t.is_contiguous() if contiguous else (t.dim() == 0 or t.stride(-1) == 1 or t.size(-1) == 1))
    ):
        return t
    got = _shape(t) if isinstance(t, torch.Tensor) else type(t).__name__
    layout = "contiguous" if contiguous else "its last dimension contiguous"
    raise ValueError(
        f"native.{function}: {name} must be a CPU {str(dtype).removeprefix('torch.')} tensor"
        f"{'' if dims is None else f' of {dims} dimensions'}, {layout}; got {got}"
    )


def fail(function: str, what: str) -> None:
    """A size or bound a kernel relies on does not hold: a ValueError naming the kernel and what was expected (the
    callers test first and build the message only then: these checks run at every decoding step)."""
    raise ValueError(f"native.{function}: {what}")


def done(function: str, code: int) -> int:
    """A kernel's return code: NO_MEMORY and OUT_OF_BOUNDS raise, the others return."""
    if code == NO_MEMORY:
        raise MemoryError(f"native.{function}: out of memory for its scratch")
    if code == OUT_OF_BOUNDS:
        raise ValueError(f"native.{function}: an argument out of its bounds (the kernel refused it)")
    return code


def _index_within(function: str, name: str, index: torch.Tensor | None, size: int) -> None:
    """Every entry of an index tensor (anc, slots: int64, 1 or 2 dims, the last contiguous) names one of `size`
    rows; checked in one pass in C (a torch reduction cost more than the step's other checks together)."""
    if index is None or not index.numel():
        return
    rows, cols = (1, index.size(0)) if index.dim() == 1 else index.shape
    stride = index.size(0) if index.dim() == 1 else index.stride(0)
    if not library().nmt_indices_within(index.data_ptr(), rows, cols, stride, size):
        low, high = (int(v) for v in torch.aminmax(index))
        fail(function, f"{name} holds {low}..{high}; expected indices in [0, {size})")


def usable(*tensors: torch.Tensor) -> bool:
    """Whether the kernels can take these tensors: built here, float32 on the CPU, the last dim contiguous (each
    kernel's caller checks the rest of its layout)."""
    if library() is None:
        return False
    for t in tensors:  # (a loop, not all() over a generator: called for every layer of every step)
        if not t.is_cpu or t.dtype is not torch.float32 or t.stride(-1) != 1:
            return False
    return True


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x (R, I) fp32 contiguous -> q (R, I) int8, scale (R, 1): Int8Linear's per-row quantization in one pass."""
    rows, width = need("quantize_rows", "x", x, dims=2).shape
    q = torch.empty((rows, width), dtype=torch.int8)
    scale = torch.empty((rows, 1), dtype=torch.float32)
    library().quantize_rows(x.data_ptr(), rows, width, q.data_ptr(), scale.data_ptr())
    return q, scale


def dequantize(
    product: torch.Tensor, row_scale: torch.Tensor, col_scale: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """product (R, O) int32 -> (R, O) fp32 = product * row_scale (R, 1) * col_scale (O,) (+ bias (O,))."""
    rows, width = need("dequantize", "product", product, torch.int32, 2).shape
    if not (need("dequantize", "row_scale", row_scale).numel() == rows):
        fail("dequantize", f"row_scale: expected {rows} values")
    if not (need("dequantize", "col_scale", col_scale).numel() == width):
        fail("dequantize", f"col_scale: expected {width}")
    if not (bias is None or need("dequantize", "bias", bias).numel() == width):
        fail("dequantize", f"bias: expected {width}")
    y = torch.empty((rows, width), dtype=torch.float32)
    library().dequantize(
        product.data_ptr(),
        rows,
        width,
        row_scale.data_ptr(),
        col_scale.data_ptr(),
        None if bias is None else bias.data_ptr(),
        y.data_ptr(),
    )
    return y


def unit_rows_pinned(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x (R, I) fp32 -> (R + 1, I) rows divided by their largest |value|, then the pinned row; and the scales (R, 1)."""
    rows, width = need("unit_rows_pinned", "x", x, dims=2).shape
    if not (width >= 1):
        fail("unit_rows_pinned", "x: expected at least one column")
    out = torch.empty((rows + 1, width), dtype=torch.float32)
    scale = torch.empty((rows, 1), dtype=torch.float32)
    library().unit_rows_pinned(x.data_ptr(), rows, width, out.data_ptr(), scale.data_ptr())
    return out, scale


def self_attend(
    qkv: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, t: int, scale: float, anc: torch.Tensor | None = None
) -> torch.Tensor:
    """A decoder step's self-attention: qkv (R, 3H) [Q; K; V] rows; row r's K and V written at position t of slot r
    of the caches (>= R, N, >= t + 1, D) (views of buffers, last two dims contiguous), Q attending over positions
    0..t of slot r, or with anc (R, t + 1) int64 contiguous (anc[:, t] = 0..R-1), position j of slot anc[r, j]
    -> (R, H)."""
    fn = "self_attend"
    need(fn, "qkv", qkv, dims=2, contiguous=False)
    _cache_layout(fn, keys, values)
    rows, heads, dim = qkv.size(0), keys.size(1), keys.size(3)
    if not (qkv.size(1) >= 3 * heads * dim):
        fail(fn, f"qkv: {qkv.size(1)} columns; expected [Q; K; V] of 3 x {heads * dim}")
    _rows_of(fn, keys, rows, t, anc)
    out = torch.empty((rows, heads * dim), dtype=torch.float32)
    code = library().self_attend(
        qkv.data_ptr(), rows, heads, dim, qkv.stride(0), keys.data_ptr(), values.data_ptr(),
        keys.stride(0), keys.stride(1), t, scale, out.data_ptr(), None if anc is None else anc.data_ptr(),
        0 if anc is None else anc.stride(0),
    )  # fmt: skip
    done(fn, code)
    return out


def _cache_layout(function: str, keys: torch.Tensor, values: torch.Tensor) -> None:
    """Self-attention caches (slots, N, positions, D): float32, each position's D floats contiguous and positions
    D apart (views of larger buffers are fine), keys and values alike."""
    need(function, "keys", keys, dims=4, contiguous=False)
    need(function, "values", values, dims=4, contiguous=False)
    if not (keys.shape == values.shape and keys.stride() == values.stride()):
        fail(function, f"keys {_shape(keys)} and values {_shape(values)}: expected the same shape and strides")
    if not (keys.size(2) <= 1 or keys.stride(2) == keys.size(3)):
        fail(function, f"keys {_shape(keys)}: positions not D apart")


def attend(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    bias: torch.Tensor,
    scale: float,
    need_weights: bool,
    slots: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Cross-attention of a step: q (R, H), a sentence's R // B rows together, over its keys/values (B, N, W, D)
    (each key's D floats contiguous, keys and values strided alike: contiguous tensors, or views of one fused
    projection's output), bias (B, 1, 1, W) contiguous added to the scores -> (R, H) and, if asked, the weights
    (B, N, R // B, W). With slots (B,) int64 contiguous, sentence b's keys and values are those at index slots[b]
    of keys and values (B' >= B of them; bias stays one per sentence)."""
    fn = "attend"
    rows = need(fn, "q", q, dims=2, contiguous=False).size(0)
    need(fn, "keys", keys, dims=4, contiguous=False)
    need(fn, "values", values, dims=4, contiguous=False)
    if not (keys.shape == values.shape and keys.stride() == values.stride()):
        fail(fn, "keys and values: expected the same strides")
    kv_rows, heads, width, dim = keys.shape
    sentences = kv_rows if slots is None else need(fn, "slots", slots, torch.int64, 1).numel()
    _index_within(fn, "slots", slots, kv_rows)
    if not (sentences >= 1 and rows % sentences == 0):
        fail(fn, f"{rows} query rows for {sentences} sentences")
    if not (q.size(1) >= heads * dim):
        fail(fn, f"q: {q.size(1)} columns; expected {heads * dim}")
    if not (need(fn, "bias", bias).numel() == sentences * width):
        fail(fn, f"bias: expected {sentences} x {width} values")
    out = torch.empty((rows, heads * dim), dtype=torch.float32)
    weights = torch.empty((rows, heads, width), dtype=torch.float32) if need_weights else None
    code = library().attend(
        q.data_ptr(), rows, heads, dim, q.stride(0), rows // sentences, keys.data_ptr(), values.data_ptr(),
        *keys.stride()[:3], width, bias.data_ptr(), width, scale, out.data_ptr(),
        None if weights is None else weights.data_ptr(), None if slots is None else slots.data_ptr(),
    )  # fmt: skip
    done(fn, code)
    if weights is not None:
        weights = weights.view(sentences, rows // sentences, heads, width).transpose(1, 2)
    return out, weights


def pack_vnni(weight_t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """int8 weights (I, O) in vnni_linear's layout (O / 16, I / 4, 16, 4) and their column sums (O,) int32; None
    where that kernel cannot take them (I % 4, O % 64, I > 4096) or this build has no VNNI."""
    inner, out = weight_t.shape
    if inner % 4 or out % 64 or inner > 4096 or not vnni():
        return None
    packed = weight_t.reshape(inner // 4, 4, out // 16, 16).permute(2, 0, 3, 1).contiguous()
    return packed, weight_t.sum(0, dtype=torch.int32)


@functools.cache
def vnni() -> bool:
    """Whether the kernels were built with AVX-512 VNNI (vnni_linear works)."""
    lib = library()
    if lib is None:
        return False
    x, w = torch.ones(1, 4), torch.ones(4, 64, dtype=torch.int8)
    y = torch.empty(1, 64)
    packed = w.reshape(1, 4, 4, 16).permute(2, 0, 3, 1).contiguous()
    colsum, scale = w.sum(0, dtype=torch.int32), torch.ones(64)
    return bool(
        lib.vnni_linear(
            x.data_ptr(), 1, 4, 64, packed.data_ptr(), colsum.data_ptr(), scale.data_ptr(), None, y.data_ptr()
        )
    )


@functools.cache
def amx() -> bool:
    """Whether vnni_linear and layer_step run their products on AMX tiles here (Intel Xeon 4th generation on)."""
    return vnni() and bool(library().has_amx())


def amx_shape(inner: int, out: int) -> bool:
    """Whether a linear of this shape runs on AMX here: then vnni_linear beats every other int8 product at any
    number of rows (measured 2026-12-03 on one thread: 2.3x-4.3x torch._int_mm's chain, 2.5x-3.3x oneDNN's
    8,000-unit vocabulary product from 1 to 320 rows), so Int8Linear takes it for all of them."""
    return inner % 64 == 0 and out % 64 == 0 and amx()


@functools.cache
def fp32() -> bool:
    """Whether the kernels were built with AVX-512 (fp32_linear and the fused fp32 layer on `pack_f32`'s weights)."""
    lib = library()
    if lib is None:
        return False
    x, packed, y = torch.ones(1, 1), torch.ones(4, 1, 16), torch.empty(1, 64)
    return bool(lib.fp32_linear(x.data_ptr(), 1, 1, 64, packed.data_ptr(), None, y.data_ptr())) and bool((y == 1).all())


def pack_f32(weight: torch.Tensor, bias: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """fp32 weights (O, I) in fp32_linear's layout (O' / 16, I, 16), the output units padded with zeros to O' a
    multiple of 64, and the bias (O,) padded alike (None for none)."""
    out, inner = weight.shape
    pad = padded(out) - out
    w = F.pad(weight.detach().float(), (0, 0, 0, pad))  # (O', I)
    packed = w.t().reshape(inner, -1, 16).permute(1, 0, 2).contiguous()
    return packed, None if bias is None else F.pad(bias.detach().float(), (0, pad)).contiguous()


def fp32_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, out: int) -> torch.Tensor:
    """x (R, I) fp32 contiguous -> (R, out) = x W^T + b on `pack_f32`'s weights, in one call."""
    rows, inner = need("fp32_linear", "x", x, dims=2).shape
    need("fp32_linear", "packed", packed, dims=3)
    width = packed.size(0) * 16
    if not (packed.shape[1:] == (inner, 16)):
        fail("fp32_linear", f"packed {tuple(packed.shape)}: expected (O' / 16, {inner}, 16)")
    if not (bias is None or need("fp32_linear", "bias", bias).numel() == width):
        fail("fp32_linear", f"bias: expected {width}")
    if not (out <= width):
        fail("fp32_linear", f"out={out}: the packed weights have {width} units")
    y = torch.empty((rows, width), dtype=torch.float32)
    library().fp32_linear(
        x.data_ptr(), rows, inner, width, packed.data_ptr(), None if bias is None else bias.data_ptr(), y.data_ptr()
    )
    return y if width == out else y[:, :out].contiguous()


def padded(out: int) -> int:
    """Output units rounded up to what vnni_linear takes (a multiple of 64)."""
    return -(-out // 64) * 64


def vnni_linear(
    x: torch.Tensor, packed: torch.Tensor, colsum: torch.Tensor, col_scale: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """x (R, I) fp32 contiguous -> (R, O): Int8Linear's quantize, product and scaling in one call (`pack_vnni`)."""
    fn = "vnni_linear"
    rows, inner = need(fn, "x", x, dims=2).shape
    out = need(fn, "colsum", colsum, torch.int32, 1).numel()
    if not (need(fn, "packed", packed, torch.int8, 4).shape == (out // 16, inner // 4, 16, 4)):
        fail(fn, f"packed {tuple(packed.shape)}: expected ({out // 16}, {inner // 4}, 16, 4)")
    if not (inner % 4 == 0 and out % 64 == 0):
        fail(fn, f"({inner}, {out}): expected inputs a multiple of 4, outputs of 64")
    if not (need(fn, "col_scale", col_scale).numel() == out):
        fail(fn, f"col_scale: expected {out} values")
    if not (bias is None or need(fn, "bias", bias).numel() == out):
        fail(fn, f"bias: expected {out} values")
    y = torch.empty((rows, out), dtype=torch.float32)
    done = library().vnni_linear(
        x.data_ptr(), rows, inner, out, packed.data_ptr(), colsum.data_ptr(), col_scale.data_ptr(),
        None if bias is None else bias.data_ptr(), y.data_ptr(),
    )  # fmt: skip
    if done != 1:
        raise (
            MemoryError(f"vnni_linear: no memory for a row of {inner} inputs")
            if done < 0
            else RuntimeError("vnni_linear: this build has no int8 kernel")
        )
    return y


def layer_step(
    made: tuple[Layer8, list],
    x: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    t: int,
    cross_k: torch.Tensor,
    cross_v: torch.Tensor,
    cross_bias: torch.Tensor,
    need_weights: bool,
    anc: torch.Tensor | None = None,
    cross_slots: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """DecoderLayer.step_one in one call (`layer8`): x (R, 1, H) -> (R, 1, H), cross weights (B, N, R // B, W);
    the caches and anc as in `self_attend`, the cross-attention's keys and values as in `attend`."""
    fn = "layer_step"
    struct = made[0]
    rows, dim = x.size(0), struct.dim
    if not (need(fn, "x", x, dims=3).shape[1:] == (1, dim)):
        fail(fn, f"x {tuple(x.shape)}: expected ({rows}, 1, {dim})")
    _step_caches(fn, struct, rows, [keys, values], t, anc)
    _cross(fn, struct, rows, [cross_k, cross_v], cross_bias, cross_slots)
    sentences, heads, width, _ = cross_k.shape
    sentences = sentences if cross_slots is None else cross_slots.numel()
    out = x.reshape(rows, dim).clone()
    ffn = struct.ffn_in.out
    scratch = torch.empty(rows * (3 * dim + max(3 * dim, ffn)), dtype=torch.float32)
    weights = torch.empty((rows, heads, width), dtype=torch.float32) if need_weights else None
    step = library().layer_step32 if isinstance(struct, Layer32) else library().layer_step
    code = step(
        ctypes.byref(struct), out.data_ptr(), rows, keys.data_ptr(), values.data_ptr(), keys.stride(0),
        keys.stride(1), t, cross_k.data_ptr(), cross_v.data_ptr(), width, cross_bias.data_ptr(), sentences,
        None if weights is None else weights.data_ptr(), scratch.data_ptr(), None if anc is None else anc.data_ptr(),
        0 if anc is None else anc.stride(0), None if cross_slots is None else cross_slots.data_ptr(),
    )  # fmt: skip
    if done(fn, code) == 0:
        raise ValueError("native.layer_step: an int8 layer on a build without VNNI (layer8 makes none there)")
    if weights is not None:
        weights = weights.view(sentences, rows // sentences, heads, width).transpose(1, 2)
    return out.view(rows, 1, dim), weights


def decoder_step(
    made: list[tuple[Layer8, list]] | list[tuple[Layer32, list]],
    tokens: torch.Tensor,
    embed: torch.Tensor,
    scale: float,
    pe: torch.Tensor,
    caches: list[torch.Tensor],
    t: int,
    cross: list[torch.Tensor],
    cross_bias: torch.Tensor,
    anc: torch.Tensor,
    cross_slots: torch.Tensor,
    norm: tuple[torch.Tensor, torch.Tensor, float] | None,
    src_width: int,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """A decoding copy's TransformerDecoder step in one call: tokens (R,) int64 -> the final norm's output (R, H)
    and the last layer's cross-attention mean over heads (R, S). made: each layer's `layer8` (all) or `layer32`
    (all); embed (V, H) and pe (H,): the embedding's weight and position t's encoding, x = embed[token] * scale +
    pe as Embedding computes it; caches [k0, v0, k1, v1, ...] shared buffers as `layer_step` takes them, with anc
    (R, t + 1); cross [ck0, cv0, ...] (B', N, W, D) contiguous, indexed by cross_slots (B,); norm (weight, bias,
    eps) or None. None where this build has no int8 kernel."""
    fn = "decoder_step"
    rows, n = need(fn, "tokens", tokens, torch.int64, 1).numel(), len(made)
    if not (n >= 1 and len({type(m[0]) for m in made}) == 1):
        fail(fn, "made: expected the layers all int8 or all fp32")
    first = made[0][0]
    dim, heads = first.dim, first.heads
    if not (len(caches) == 2 * n and len(cross) == 2 * n):
        fail(fn, f"expected {2 * n} caches and cross tensors for {n} layers")
    _step_caches(fn, first, rows, caches, t, anc, needed=True)
    _cross(fn, first, rows, cross, cross_bias, cross_slots, needed=True)
    _embedding(fn, first, embed, pe, 1)
    width = cross[0].size(2)
    if not (0 <= src_width <= width):
        fail(fn, f"src_width={src_width}: the cross keys hold {width} positions")
    if not (norm is None or _norm(fn, norm, dim)):
        fail(fn, "norm")
    ffn = max(m[0].ffn_in.out for m in made)
    x = torch.empty((rows, dim), dtype=torch.float32)
    scratch = torch.empty(rows * (3 * dim + max(3 * dim, ffn)) + rows * heads * width, dtype=torch.float32)
    attn = torch.empty((rows, src_width), dtype=torch.float32)
    pointers = ctypes.c_void_p * n
    keys = caches[0]  # every buffer has its strides
    result = library().decoder_step(
        pointers(*(ctypes.addressof(m[0]) for m in made)), n, int(isinstance(first, Layer8)), tokens.data_ptr(),
        embed.data_ptr(), embed.size(0), scale, pe.data_ptr(), x.data_ptr(), rows,
        pointers(*(c.data_ptr() for c in caches[0::2])), pointers(*(c.data_ptr() for c in caches[1::2])),
        keys.stride(0), keys.stride(1), t, pointers(*(c.data_ptr() for c in cross[0::2])),
        pointers(*(c.data_ptr() for c in cross[1::2])), width, cross_bias.data_ptr(), cross_slots.numel(),
        scratch.data_ptr() + rows * (3 * dim + max(3 * dim, ffn)) * 4, scratch.data_ptr(), anc.data_ptr(),
        anc.stride(0), cross_slots.data_ptr(), *((norm[0].data_ptr(), norm[1].data_ptr()) if norm else (None, None)),
        norm[2] if norm else 0.0,
        attn.data_ptr(), src_width,
    )  # fmt: skip
    if done(fn, result) == BAD_TOKEN:
        raise IndexError(f"a token outside the target vocabulary [0, {embed.size(0)})")
    return (x, attn) if result else None


def encoder_forward(
    made: list[tuple[Layer8, list]] | list[tuple[Layer32, list]],
    src: torch.Tensor,
    embed: torch.Tensor,
    scale: float,
    pe: torch.Tensor,
    bias: torch.Tensor,
    norm: tuple[torch.Tensor, torch.Tensor, float] | None,
) -> torch.Tensor | None:
    """A decoding copy's TransformerEncoder in one call: src (B, L) int64 contiguous -> the final norm's output
    (B, L, H). made: each EncoderLayer's `layer8` (all) or `layer32` (all); embed (V, H) and pe (L, H) as in
    `decoder_step`; bias (B, L) contiguous: 0 where a key may be attended, -inf at padding; norm (weight, bias, eps)
    or None. None where this build has no int8 kernel."""
    fn = "encoder_forward"
    sentences, length = need(fn, "src", src, torch.int64, 2).shape
    if not (len(made) >= 1 and len({type(m[0]) for m in made}) == 1):
        fail(fn, "made: expected the layers all int8 or all fp32")
    first = made[0][0]
    dim, rows = first.dim, sentences * length
    _embedding(fn, first, embed, pe, length)
    if not (need(fn, "bias", bias).numel() == rows):
        fail(fn, f"bias: expected {sentences} x {length} values")
    if not (norm is None or _norm(fn, norm, dim)):
        fail(fn, "norm")
    ffn = max(m[0].ffn_in.out for m in made)
    x = torch.empty((sentences, length, dim), dtype=torch.float32)
    scratch = torch.empty(rows * (3 * dim + max(3 * dim, ffn)), dtype=torch.float32)
    result = library().encoder_forward(
        (ctypes.c_void_p * len(made))(*(ctypes.addressof(m[0]) for m in made)), len(made),
        int(isinstance(first, Layer8)), src.data_ptr(), embed.data_ptr(), embed.size(0), scale, pe.data_ptr(),
        x.data_ptr(), sentences, length, bias.data_ptr(), scratch.data_ptr(),
        *((norm[0].data_ptr(), norm[1].data_ptr()) if norm else (None, None)), norm[2] if norm else 0.0,
    )  # fmt: skip
    if done(fn, result) == BAD_TOKEN:
        raise IndexError(f"a token outside the source vocabulary [0, {embed.size(0)})")
    return x if result else None


def _step_caches(
    fn: str, struct, rows: int, caches: list[torch.Tensor], t: int, anc: torch.Tensor | None, needed: bool = False
) -> None:
    """A step's self-attention caches [k0, v0, ...] (slots, N, positions, D) as `self_attend` takes them, all with
    the first one's strides (the kernels take one set), and anc (R, >= t + 1) int64 indexing their slots."""
    for i in range(0, len(caches), 2):
        _cache_layout(fn, caches[i], caches[i + 1])
        if not (caches[i].stride() == caches[0].stride() and caches[i].shape == caches[0].shape):
            fail(fn, "caches: one layout")
    keys = caches[0]
    if not (keys.shape[1] == struct.heads and keys.shape[3] == struct.head_dim):
        fail(fn, f"caches {tuple(keys.shape)}: expected {struct.heads} heads of {struct.head_dim}")
    if not (anc is not None or not needed):
        fail(fn, "anc: expected the rows' ancestors")
    _rows_of(fn, keys, rows, t, anc)


def _rows_of(fn: str, keys: torch.Tensor, rows: int, t: int, anc: torch.Tensor | None) -> None:
    """Position t within the caches, and each of `rows` rows' slots: its own (slot r, without anc) or those anc
    (R, >= t + 1) int64 names for positions 0..t."""
    if not (0 <= t < keys.size(2)):
        fail(fn, f"t={t}: the caches hold {keys.size(2)} positions")
    if anc is None:
        if not (keys.size(0) >= rows):
            fail(fn, f"the caches have {keys.size(0)} slots for {rows} rows")
    else:
        need(fn, "anc", anc, torch.int64, 2, contiguous=False)
        if not (anc.size(0) == rows and anc.size(1) >= t + 1):
            fail(fn, f"anc {tuple(anc.shape)}: expected ({rows}, >= {t + 1})")
        _index_within(fn, "anc", anc[:, : t + 1], keys.size(0))


def _cross(
    fn: str,
    struct,
    rows: int,
    cross: list[torch.Tensor],
    bias: torch.Tensor,
    slots: torch.Tensor | None,
    needed: bool = False,
) -> None:
    """Cross-attention keys and values [ck0, cv0, ...] (B', N, W, D) contiguous, bias (B, 1, 1, W) contiguous, and
    slots (B,) int64 indexing B'."""
    for i, c in enumerate(cross):
        need(fn, f"cross[{i}]", c, dims=4)
        if not (c.shape == cross[0].shape):
            fail(fn, f"cross[{i}] {tuple(c.shape)}: expected {tuple(cross[0].shape)}")
    kv_rows, heads, width, dim = cross[0].shape
    if not ((heads, dim) == (struct.heads, struct.head_dim)):
        fail(fn, f"cross keys {tuple(cross[0].shape)}: heads or size")
    if not (slots is not None or not needed):
        fail(fn, "slots: expected the sentences' cross-attention slots")
    sentences = kv_rows if slots is None else need(fn, "slots", slots, torch.int64, 1).numel()
    _index_within(fn, "slots", slots, kv_rows)
    if not (sentences >= 1 and rows % sentences == 0):
        fail(fn, f"{rows} rows for {sentences} sentences")
    if not (need(fn, "cross_bias", bias).numel() == sentences * width):
        fail(fn, f"cross_bias: expected {sentences} x {width}")


def _embedding(fn: str, struct, embed: torch.Tensor, pe: torch.Tensor, positions: int) -> None:
    """embed (V, H) and pe (positions, H) or (H,), contiguous float32."""
    if not (need(fn, "embed", embed, dims=2).size(1) == struct.dim):
        fail(fn, f"embed {tuple(embed.shape)}: expected H={struct.dim}")
    if not (need(fn, "pe", pe).numel() == positions * struct.dim):
        fail(fn, f"pe {tuple(pe.shape)}: expected {positions} x {struct.dim}")


def _norm(fn: str, norm: tuple, dim: int) -> bool:
    return need(fn, "norm weight", norm[0]).numel() == dim and need(fn, "norm bias", norm[1]).numel() == dim


def row_argmax(x: torch.Tensor, banned: Sequence[int] = ()) -> torch.Tensor:
    """x (R, V) fp32 contiguous -> (R,) int64: x.argmax(1) in one pass per row (rows without NaN), with the tokens in
    `banned` taken as -inf (the argmax of x after x[:, banned] = -inf, without writing x)."""
    rows, width = need("row_argmax", "x", x, dims=2).shape
    if not (width >= 1):
        fail("row_argmax", "x: expected at least one column")
    ban = _banned(tuple(banned))
    out = torch.empty(rows, dtype=torch.int64)
    if library().row_argmax(x.data_ptr(), rows, width, ban.data_ptr(), ban.numel(), out.data_ptr()) == OUT_OF_BOUNDS:
        raise ValueError(f"native.row_argmax: banned tokens {list(banned)}: expected tokens in [0, {width})")
    return out


@functools.lru_cache(maxsize=64)
def _banned(tokens: tuple[int, ...]) -> torch.Tensor:
    """A search's banned tokens as the kernels read them (int64), made once per set (every step passes one)."""
    return torch.tensor(tokens, dtype=torch.int64)


def log_softmax_topk(x: torch.Tensor, k: int, banned: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """x (R, V) fp32 contiguous logits -> the k best log-probabilities (R, k) outside `banned` and their tokens
    (R, k): log_softmax(x).topk(k) with `banned` at -inf, without the (R, V) log-softmax (k <= 64, and at
    least k tokens outside `banned`)."""
    rows, width = need("log_softmax_topk", "x", x, dims=2).shape
    if not (1 <= k <= min(TOPK_MAX, width)):
        fail("log_softmax_topk", f"k={k}: expected 1 to {min(TOPK_MAX, width)}")
    values = torch.empty((rows, k), dtype=torch.float32)
    index = torch.empty((rows, k), dtype=torch.int64)
    ban = torch.tensor(banned, dtype=torch.int64)
    code = library().log_softmax_topk(
        x.data_ptr(), rows, width, k, ban.data_ptr(), ban.numel(), values.data_ptr(), index.data_ptr()
    )
    if code == OUT_OF_BOUNDS:
        raise ValueError(
            f"native.log_softmax_topk: k={k} for {width} tokens, {len(banned)} banned: expected banned tokens in "
            f"[0, {width}) and at least k tokens left"
        )
    return values, index


def _xent_args(function: str, logits: torch.Tensor, target: torch.Tensor, smoothing: float) -> tuple[int, int, int]:
    """The checks both loss kernels share: logits (R, V) fp32 or bf16 contiguous, target (R,) int64 contiguous (its
    values are checked in C), smoothing in [0, 1]; -> (bf16 flag, R, V)."""
    bf16 = isinstance(logits, torch.Tensor) and logits.dtype is torch.bfloat16
    rows, width = need(function, "logits", logits, torch.bfloat16 if bf16 else torch.float32, 2).shape
    if not (need(function, "target", target, torch.int64, 1).numel() == rows):
        fail(function, f"target: {target.numel()} values for {rows} rows of logits")
    if not (width >= 1 and 0.0 <= smoothing <= 1.0):
        fail(function, f"{width} columns, smoothing {smoothing}: expected at least one column and 0 <= smoothing <= 1")
    return int(bf16), rows, width


def xent_forward(logits: torch.Tensor, target: torch.Tensor, smoothing: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Label-smoothed cross-entropy per row of logits (R, V) fp32 or bf16 against target (R,): (loss (R,),
    logsumexp (R,)), fp32, in one pass over each row (csrc/loss.c)."""
    bf16, rows, width = _xent_args("xent_forward", logits, target, smoothing)
    loss, lse = torch.empty(rows, dtype=torch.float32), torch.empty(rows, dtype=torch.float32)
    code = library().xent_forward(
        logits.data_ptr(), bf16, rows, width, target.data_ptr(), smoothing, loss.data_ptr(), lse.data_ptr()
    )
    if code == OUT_OF_BOUNDS:
        low, high = (int(v) for v in torch.aminmax(target))
        fail("xent_forward", f"target holds {low}..{high}; expected tokens in [0, {width})")
    done("xent_forward", code)
    return loss, lse


def xent_backward(
    logits: torch.Tensor, target: torch.Tensor, smoothing: float, lse: torch.Tensor, scale: float
) -> torch.Tensor:
    """The gradient (R, V), in the logits' dtype, of the summed loss of `xent_forward` times `scale`, from the
    logits and their logsumexp (R,): (softmax - smoothing / V - (1 - smoothing) onehot(target)) * scale."""
    bf16, rows, width = _xent_args("xent_backward", logits, target, smoothing)
    if not (need("xent_backward", "lse", lse, dims=1).numel() == rows):
        fail("xent_backward", f"lse: {lse.numel()} values for {rows} rows")
    grad = torch.empty_like(logits)
    code = library().xent_backward(
        logits.data_ptr(), bf16, rows, width, target.data_ptr(), smoothing, lse.data_ptr(), scale, grad.data_ptr()
    )
    if code == OUT_OF_BOUNDS:
        fail("xent_backward", f"target: expected tokens in [0, {width})")
    done("xent_backward", code)
    return grad


def dropout_apply(x: torch.Tensor, seed: int, dropped: int, scale: float) -> torch.Tensor:
    """x (any shape) fp32 or bf16 contiguous -> x * scale where the 16-bit draw (seed, element) >= dropped, else 0,
    in x's dtype (csrc/dropout.c): dropout's mask drawn and applied in one pass, never stored. The same call on the
    output's gradient is its backward. seed in [0, 2**64), dropped in [0, 65536], scale >= 0."""
    bf16 = isinstance(x, torch.Tensor) and x.dtype is torch.bfloat16
    need("dropout_apply", "x", x, torch.bfloat16 if bf16 else torch.float32)
    if not (0 <= seed < 1 << 64 and 0 <= dropped <= 1 << 16 and scale >= 0.0):
        fail("dropout_apply", f"seed {seed}, dropped {dropped}, scale {scale}: expected a 64-bit seed, 0 <= dropped "
             "<= 65536 and scale >= 0")  # fmt: skip
    out = torch.empty_like(x)
    code = library().dropout_apply(x.data_ptr(), int(bf16), x.numel(), seed, dropped, scale, out.data_ptr())
    done("dropout_apply", code)
    return out


def layer_norm_bf16_forward(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Layer normalization of x (R, H) fp32 contiguous with weight and bias (H,) fp32 (csrc/layernorm.c): the output
    (R, H) in bf16 and each row's mean and 1 / std (R,), fp32."""
    rows, width = need("layer_norm_bf16_forward", "x", x, dims=2).shape
    for name, t in (("weight", weight), ("bias", bias)):
        if not need("layer_norm_bf16_forward", name, t, dims=1).numel() == width:
            fail("layer_norm_bf16_forward", f"{name}: {t.numel()} values for rows of {width}")
    if not (width >= 1 and eps >= 0.0):
        fail("layer_norm_bf16_forward", f"width {width}, eps {eps}: expected at least one column and eps >= 0")
    y = torch.empty((rows, width), dtype=torch.bfloat16)
    mean, rstd = torch.empty(rows), torch.empty(rows)
    code = library().layer_norm_bf16_forward(
        x.data_ptr(), rows, width, weight.data_ptr(), bias.data_ptr(), eps, y.data_ptr(), mean.data_ptr(),
        rstd.data_ptr(),
    )  # fmt: skip
    done("layer_norm_bf16_forward", code)
    return y, mean, rstd


def layer_norm_bf16_backward(
    x: torch.Tensor, grad: torch.Tensor, weight: torch.Tensor, mean: torch.Tensor, rstd: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The gradients of `layer_norm_bf16_forward` from the output's gradient (R, H) bf16 or fp32 contiguous: for x
    (R, H), weight and bias (H,), all fp32."""
    rows, width = need("layer_norm_bf16_backward", "x", x, dims=2).shape
    bf16 = isinstance(grad, torch.Tensor) and grad.dtype is torch.bfloat16
    if need("layer_norm_bf16_backward", "grad", grad, torch.bfloat16 if bf16 else torch.float32, 2).shape != x.shape:
        fail("layer_norm_bf16_backward", f"grad {tuple(grad.shape)}: expected the shape of x, {tuple(x.shape)}")
    if not need("layer_norm_bf16_backward", "weight", weight, dims=1).numel() == width:
        fail("layer_norm_bf16_backward", f"weight: {weight.numel()} values for rows of {width}")
    for name, t in (("mean", mean), ("rstd", rstd)):
        if not need("layer_norm_bf16_backward", name, t, dims=1).numel() == rows:
            fail("layer_norm_bf16_backward", f"{name}: {t.numel()} values for {rows} rows")
    dx, dw, db = torch.empty_like(x), torch.empty(width), torch.empty(width)
    partial = torch.empty((rows + 63) // 64, 2, width)
    code = library().layer_norm_bf16_backward(
        x.data_ptr(), grad.data_ptr(), int(bf16), rows, width, weight.data_ptr(), mean.data_ptr(), rstd.data_ptr(),
        dx.data_ptr(), partial.data_ptr(), dw.data_ptr(), db.data_ptr(),
    )  # fmt: skip
    done("layer_norm_bf16_backward", code)
    return dx, dw, db


def _additive_operands(function: str, q: torch.Tensor, keys: torch.Tensor, v: torch.Tensor) -> tuple[int, int, int]:
    """(B, S, A) of additive_scores_*'s q (B, A) bf16 whose last dimension is contiguous and whose rows do not
    overlap, keys (B, S, A) bf16 contiguous and v (A,) fp32, after checking that they agree."""
    batch, length, width = need(function, "keys", keys, torch.bfloat16, 3).shape
    need(function, "q", q, torch.bfloat16, 2, contiguous=False)
    if q.shape != (batch, width) or (batch > 1 and q.stride(0) < width):
        fail(function, f"q {tuple(q.shape)} (row stride {q.stride(0)}): expected ({batch}, {width}), rows apart")
    if need(function, "v", v, dims=1).numel() != width or width < 1:
        fail(function, f"v: {v.numel()} values for keys of width {width}: expected as many, at least one")
    return batch, length, width


def additive_scores_forward(q: torch.Tensor, keys: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Bahdanau's additive scores e_bs = sum_a v_a tanh(q_ba + k_bsa) (B, S) fp32 for one decoder step
    (csrc/additive.c): q (B, A) and keys (B, S, A) bf16, v (A,) fp32."""
    batch, length, width = _additive_operands("additive_scores_forward", q, keys, v)
    scores = torch.empty((batch, length))
    code = library().additive_scores_forward(
        q.data_ptr(), max(q.stride(0), width), keys.data_ptr(), v.data_ptr(), batch, length, width, scores.data_ptr()
    )
    done("additive_scores_forward", code)
    return scores


def additive_scores_backward(
    q: torch.Tensor, keys: torch.Tensor, v: torch.Tensor, grad: torch.Tensor, dkeys: torch.Tensor, dv_rows: torch.Tensor
) -> torch.Tensor:
    """The backward of `additive_scores_forward` from the scores' gradient grad (B, S) fp32: returns q's gradient
    (B, A) and adds the keys' into dkeys (B, S, A) and each sentence's part of v's into dv_rows (B, A), all fp32
    (they sum over a decoder's steps)."""
    function = "additive_scores_backward"
    batch, length, width = _additive_operands(function, q, keys, v)
    for name, t, shape in (
        ("grad", grad, (batch, length)),
        ("dkeys", dkeys, (batch, length, width)),
        ("dv_rows", dv_rows, (batch, width)),
    ):
        if need(function, name, t, dims=len(shape)).shape != shape:
            fail(function, f"{name} {tuple(t.shape)}: expected {shape}")
    dq = torch.empty((batch, width))
    code = library().additive_scores_backward(
        q.data_ptr(), max(q.stride(0), width), keys.data_ptr(), v.data_ptr(), grad.data_ptr(), batch, length, width,
        dq.data_ptr(), dkeys.data_ptr(), dv_rows.data_ptr(),
    )  # fmt: skip
    done(function, code)
    return dq
