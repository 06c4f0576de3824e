"""The native kernels' boundaries: every wrapper refuses a layout the C would misread (one clear error, never a
crash), the C structs' layout is checked against the ctypes copies at load, the cache cannot be planted or go
stale, a failed build says why, cached structs follow their layer's parameters, and the kernels of every
instruction set this CPU has did build and run."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import nmt.search as search
from nmt.config import ModelConfig
from nmt.engine import build, decoding_copy, native, structs
from nmt.models.builders import build_model
from nmt.runtime import cpu_info
from tests.conftest import random_batch

ROOT = Path(__file__).resolve().parents[1]
built = pytest.mark.skipif(native.library() is None, reason="no C compiler here: the kernels fall back to torch")
compiler = pytest.mark.skipif(build._compiler() is None, reason="no C compiler here")


@built
def test_every_wrapper_refuses_what_its_kernel_would_misread():
    x = torch.randn(4, 8)
    expanded = torch.randn(1, 8).expand(4, 8)  # stride 0: the C would read one row four times, or past it
    refused = {
        "quantize_rows: x must be a CPU float32": lambda: native.quantize_rows(expanded),
        "quantize_rows: x must be a CPU float32 tensor of 2 dimensions": lambda: native.quantize_rows(x.double()),
        "dequantize: col_scale: expected 8": lambda: native.dequantize(
            torch.ones(4, 8, dtype=torch.int32), torch.ones(4, 1), torch.ones(7), None
        ),
        "unit_rows_pinned: x must be": lambda: native.unit_rows_pinned(x.t()),
        "row_argmax: x must be": lambda: native.row_argmax(x.to(torch.int64)),
        "row_argmax: banned tokens [8]": lambda: native.row_argmax(x, [8]),
        "row_argmax: banned tokens [-1]": lambda: native.row_argmax(x, [-1]),
        "log_softmax_topk: k=65": lambda: native.log_softmax_topk(torch.randn(2, 100), 65, []),
        "log_softmax_topk: k=9": lambda: native.log_softmax_topk(x, 9, []),
        "log_softmax_topk: k=3 for 8 tokens, 6 banned": lambda: native.log_softmax_topk(x, 3, [0, 1, 2, 3, 4, 5]),
        "log_softmax_topk: k=1 for 8 tokens, 1 banned": lambda: native.log_softmax_topk(x, 1, [8]),
        "xent_forward: logits must be": lambda: native.xent_forward(expanded, torch.zeros(4, dtype=torch.int64), 0.1),
        "xent_forward: target must be": lambda: native.xent_forward(x, torch.zeros(4, dtype=torch.int32), 0.1),
        "xent_forward: target: 3 values for 4 rows": lambda: native.xent_forward(
            x, torch.zeros(3, dtype=torch.int64), 0.1
        ),
        "xent_forward: target holds 0..8; expected tokens in [0, 8)": lambda: native.xent_forward(
            x, torch.tensor([0, 8, 1, 2]), 0.1
        ),
        "xent_forward: target holds -1..2": lambda: native.xent_forward(x, torch.tensor([0, -1, 1, 2]), 0.1),
        "xent_forward: 8 columns, smoothing 1.5": lambda: native.xent_forward(
            x, torch.zeros(4, dtype=torch.int64), 1.5
        ),
        "xent_backward: lse: 3 values for 4 rows": lambda: native.xent_backward(
            x, torch.zeros(4, dtype=torch.int64), 0.1, torch.zeros(3), 1.0
        ),
        "xent_backward: target: expected tokens in [0, 8)": lambda: native.xent_backward(
            x, torch.tensor([9, 0, 0, 0]), 0.1, torch.zeros(4), 1.0
        ),
        "dropout_apply: x must be a CPU float32 tensor, contiguous": lambda: native.dropout_apply(expanded, 1, 10, 1.0),
        "dropout_apply: x must be a CPU float32": lambda: native.dropout_apply(x.double(), 1, 10, 1.0),
        "dropout_apply: x must be a CPU bfloat16 tensor, contiguous": lambda: native.dropout_apply(
            x.bfloat16().t(), 1, 10, 1.0
        ),
        "dropout_apply: seed -1, dropped 10": lambda: native.dropout_apply(x, -1, 10, 1.0),
        "dropout_apply: seed 1, dropped 65537": lambda: native.dropout_apply(x, 1, 65537, 1.0),
        "dropout_apply: seed 1, dropped 10, scale -1.0": lambda: native.dropout_apply(x, 1, 10, -1.0),
    }
    w8, rows4 = torch.randn(8), torch.randn(4)
    refused |= {
        "layer_norm_bf16_forward: x must be a CPU float32 tensor of 2 dimensions, contiguous": lambda: (
            native.layer_norm_bf16_forward(expanded, w8, w8, 1e-5)
        ),
        "layer_norm_bf16_forward: weight: 7 values for rows of 8": lambda: native.layer_norm_bf16_forward(
            x, torch.randn(7), w8, 1e-5
        ),
        "layer_norm_bf16_forward: bias must be a CPU float32": lambda: native.layer_norm_bf16_forward(
            x, w8, w8.to(torch.bfloat16), 1e-5
        ),
        "layer_norm_bf16_forward: width 8, eps -1.0": lambda: native.layer_norm_bf16_forward(x, w8, w8, -1.0),
        "layer_norm_bf16_backward: grad must be a CPU float32 tensor of 2 dimensions, contiguous": lambda: (
            native.layer_norm_bf16_backward(x, expanded, w8, rows4, rows4)
        ),
        "layer_norm_bf16_backward: grad (4, 7): expected the shape of x": lambda: native.layer_norm_bf16_backward(
            x, torch.randn(4, 7), w8, rows4, rows4
        ),
        "layer_norm_bf16_backward: rstd: 3 values for 4 rows": lambda: native.layer_norm_bf16_backward(
            x, x.to(torch.bfloat16), w8, rows4, torch.randn(3)
        ),
    }
    q8, keys8 = torch.randn(4, 8).bfloat16(), torch.randn(4, 3, 8).bfloat16()
    refused |= {
        "additive_scores_forward: keys must be a CPU bfloat16 tensor of 3 dimensions, contiguous": lambda: (
            native.additive_scores_forward(q8, keys8.transpose(1, 2).contiguous().transpose(1, 2), w8)
        ),
        "additive_scores_forward: q must be a CPU bfloat16 tensor of 2 dimensions, its last dimension": lambda: (
            native.additive_scores_forward(q8.t().contiguous().t(), keys8, w8)
        ),
        "additive_scores_forward: q (4, 8) (row stride 0)": lambda: native.additive_scores_forward(
            q8[:1].expand(4, 8), keys8, w8
        ),
        "additive_scores_forward: v: 7 values": lambda: native.additive_scores_forward(q8, keys8, torch.randn(7)),
        "additive_scores_backward: grad (4, 2): expected (4, 3)": lambda: native.additive_scores_backward(
            q8, keys8, w8, torch.randn(4, 2), torch.zeros(4, 3, 8), torch.zeros(4, 8)
        ),
        "additive_scores_backward: dv_rows must be a CPU float32 tensor of 2 dimensions, contiguous": lambda: (
            native.additive_scores_backward(
                q8, keys8, w8, torch.randn(4, 3), torch.zeros(4, 3, 8), torch.zeros(8, 4).t()
            )
        ),
    }
    keys = torch.randn(4, 2, 6, 4)  # (slots, N, positions, D)
    qkv = torch.randn(4, 3 * 8)
    refused |= {
        "self_attend: t=6: the caches hold 6 positions": lambda: native.self_attend(qkv, keys, keys.clone(), 6, 0.5),
        "self_attend: keys": lambda: native.self_attend(qkv, keys, keys.transpose(2, 3).contiguous(), 2, 0.5),
        "self_attend: the caches have 4 slots for 5 rows": lambda: native.self_attend(
            torch.randn(5, 24), keys, keys.clone(), 2, 0.5
        ),
        "self_attend: anc holds 0..9": lambda: native.self_attend(
            qkv, keys, keys.clone(), 2, 0.5, torch.tensor([[9, 0, 0]] * 4)
        ),
        "self_attend: qkv: 16 columns": lambda: native.self_attend(torch.randn(4, 16), keys, keys.clone(), 2, 0.5),
    }
    cross = torch.randn(2, 2, 5, 4)  # (B, N, W, D)
    bias = torch.zeros(2, 1, 1, 5)
    q = torch.randn(4, 8)
    refused |= {
        "attend: keys must be": lambda: native.attend(q, cross.expand(2, 2, 5, 4).double(), cross, bias, 0.5, False),
        "attend: bias: expected 2 x 5 values": lambda: native.attend(q, cross, cross.clone(), bias[:1], 0.5, False),
        "attend: slots holds 0..7": lambda: native.attend(
            q, cross, cross.clone(), bias, 0.5, False, torch.tensor([0, 7])
        ),
        "attend: 3 query rows for 2 sentences": lambda: native.attend(q[:3], cross, cross.clone(), bias, 0.5, False),
        "attend: values must be": lambda: native.attend(q, cross, cross.transpose(2, 3), bias, 0.5, False),
        "attend: keys and values": lambda: native.attend(q, cross, torch.randn(2, 2, 5, 8)[..., :4], bias, 0.5, False),
    }
    for message, call in refused.items():
        with pytest.raises(ValueError) as error:
            call()
        assert f"native.{message}" in str(error.value), (message, str(error.value))
        assert "\n" not in str(error.value)


@built
def test_the_right_layouts_still_pass_and_views_of_cache_buffers_are_taken():
    buffer = torch.randn(4, 2, 16, 4)
    keys, values = buffer[:, :, :6], torch.randn(4, 2, 16, 4)[:, :, :6]  # views with room behind them
    out = native.self_attend(torch.randn(4, 24), keys, values, 5, 0.5)
    assert out.shape == (4, 8)
    values, index = native.log_softmax_topk(torch.randn(3, 70), 64, [1, 2])
    assert values.shape == (3, 64) and not set(index.flatten().tolist()) & {1, 2}


@built
def test_the_c_structs_are_laid_out_as_their_python_copies():
    assert build.layout_mismatch(native.library()) is None
    assert len(structs.LAYOUT) == 4


@compiler
def test_a_struct_out_of_place_disables_the_kernels_with_one_line(monkeypatch, tmp_path, capsys):
    import ctypes

    class Swapped(ctypes.Structure):  # Linear8 with two fields in the wrong order
        _fields_ = [("packed", ctypes.c_void_p), ("scale", ctypes.c_void_p), ("colsum", ctypes.c_void_p),
                    ("bias", ctypes.c_void_p), ("inner", ctypes.c_int64), ("out", ctypes.c_int64)]  # fmt: skip

    swapped = [(Swapped, ["packed", "colsum", "scale", "bias", "inner", "out"]), *structs.LAYOUT[1:]]
    monkeypatch.setattr(build, "LAYOUT", swapped)
    monkeypatch.setattr(build, "_WARNED", set())
    monkeypatch.setenv("NMT_CACHE", str(tmp_path / "cache"))
    lib, line = build.load()
    assert lib is None and line.startswith("disabled (struct layout")
    err = capsys.readouterr().err
    assert "struct" in err and "Swapped.colsum: 8 in C, 16 in Python" in err and err.count("\n") == 1


@compiler
def test_the_cache_folder_is_private_and_a_shared_one_is_refused(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(build, "_WARNED", set())
    fresh = tmp_path / "new" / "nmt"
    path = build.build(fresh)
    assert path is not None and (fresh.stat().st_mode & 0o777) == 0o700
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    assert build.build(shared) is None
    assert "writable by other users" in capsys.readouterr().err
    assert not list(shared.iterdir())  # nothing built, nothing loaded from there
    monkeypatch.setattr(os, "getuid", lambda: os.stat(fresh).st_uid + 1)
    assert build.build(fresh) is None
    assert "belongs to another user" in capsys.readouterr().err


@compiler
def test_a_library_changed_after_its_build_is_built_again(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(build, "_WARNED", set())
    path = build.build(tmp_path)
    good = path.read_bytes()
    path.write_bytes(good + b"planted")
    assert build.build(tmp_path) == path
    assert "does not match the hash recorded" in capsys.readouterr().err
    assert path.read_bytes() != good + b"planted"
    assert build.digest(path) == path.with_suffix(".sha256").read_text().strip()


def test_the_key_holds_the_compiler_version_the_flags_and_the_cpu(monkeypatch):
    monkeypatch.setattr(build, "compiler_version", lambda compiler: "cc 1.0")
    one = build.key("/usr/bin/cc")
    monkeypatch.setattr(build, "compiler_version", lambda compiler: "cc 1.1")
    assert build.key("/usr/bin/cc") != one
    monkeypatch.setenv("NMT_NATIVE_FLAGS", "-fsanitize=address")
    assert build.key("/usr/bin/cc") not in (one,)
    monkeypatch.setattr(build, "cpu_key", lambda: "aarch64 | | | 0x41 | 8 | 0x1 | 0xd40 | fp asimd sve")
    arm = build.key("/usr/bin/cc")
    monkeypatch.setattr(build, "cpu_key", lambda: "aarch64 | | | 0x41 | 8 | 0x1 | 0xd4f | fp asimd sve2")
    assert build.key("/usr/bin/cc") != arm  # another ARM core: another library, never one built for a wider core


@compiler
def test_a_failed_build_says_why_in_one_line_and_keeps_the_compiler_output(monkeypatch, tmp_path, capsys):
    broken = tmp_path / "csrc"
    broken.mkdir()
    for name in (*build.HEADERS, *build.SOURCES):
        (broken / name).write_text((build.CSRC / name).read_text())
    (broken / "kernels.c").write_text('#include "kernels.h"\nint has_amx(void) { return undeclared_name; }\n')
    monkeypatch.setattr(build, "CSRC", broken)
    monkeypatch.setattr(build, "_WARNED", set())
    assert build.build(tmp_path / "cache") is None
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the build failed" in err and "undeclared_name" in err
    log = next((tmp_path / "cache").glob("build-*.log"))
    assert "undeclared_name" in log.read_text() and "exit 1" in log.read_text()


@built
def test_which_library_decodes_is_told():
    assert native.describe().startswith("kernels-") and ".so" in native.describe()


@compiler
def test_the_kernels_of_every_instruction_set_this_cpu_has_are_built_and_run():
    """A CPU with AVX-512 gets the AVX-512 fp32 kernels, with VNNI the int8 ones, with AMX the tiles: a build that
    silently lost one (a flag, a guard, a compiler) fails here instead of falling back to torch unnoticed."""
    flags = set(cpu_info("flags").split())
    if "avx512f" in flags:
        assert native.fp32()
    if {"avx512f", "avx512_vnni"} <= flags:
        assert native.vnni()
    if {"avx512f", "avx512_vnni", "amx_int8", "amx_tile"} <= flags:
        assert native.amx()


def tiny(precision):
    cfg = ModelConfig(dim=64, layers=2, dropout=0.0, arch="transformer", heads=4, ffn_dim=128)
    torch.manual_seed(0)
    return decoding_copy(build_model(cfg, 50, 50, joint=True).eval(), precision)


@built
@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_a_parameter_replaced_or_changed_after_a_search_is_what_the_next_search_reads(precision, monkeypatch):
    """The structs hold raw pointers into the layer: replacing a norm's weight must neither leave them reading
    freed memory nor reading the old values (they are made again), nor may an in-place change go unseen."""
    model = tiny(precision)
    batch = random_batch(50, src_lens=(9, 3, 14, 5), tgt_lens=(4,) * 4, seed=6)
    max_len = torch.full((4,), 12)

    def greedy(m):
        with torch.no_grad():
            return [(h.tokens, h.score) for h in search.greedy_search(m, batch.src, batch.src_mask, max_len)]

    greedy(model)  # the structs are made
    layer = model.decoder.layers[0]
    norm = layer.res_ffn.norm
    norm.weight = torch.nn.Parameter(norm.weight.detach() * 3.0)  # the old tensor may now be freed
    model.encoder.layers[0].res_ffn.norm.bias.data.add_(0.5)  # in place: same tensor, new version
    with_kernels = greedy(model)
    monkeypatch.setattr(native, "library", lambda: None)
    plain = greedy(model)
    assert [t for t, _ in with_kernels] == [t for t, _ in plain]
    for (_, a), (_, b) in zip(with_kernels, plain):
        assert abs(a - b) < 1e-3


SANITIZED = [
    "tests/test_native.py",
    "tests/test_native_boundaries.py::test_every_wrapper_refuses_what_its_kernel_would_misread",
    "tests/test_native_boundaries.py::test_the_right_layouts_still_pass_and_views_of_cache_buffers_are_taken",
    "tests/test_decoding_cache.py",
    "tests/test_loss.py::test_native_loss_kernels_equal_torch_within_rounding",
    "tests/test_loss.py::test_native_loss_propagates_nan_and_inf_as_torch_does",
    "tests/test_native_dropout.py::test_elements_are_dropped_at_the_rate_asked_for_and_the_mean_is_kept",
    "tests/test_native_dropout.py::test_kept_values_are_the_input_scaled_and_rounded_once",
    "tests/test_native_dropout.py::test_the_gradient_goes_through_the_same_mask_scaled",
    "tests/test_native_dropout.py::test_a_bf16_gradient_flows_back_in_bf16_and_an_expanded_one_is_made_contiguous",
    "tests/test_native_dropout.py::test_the_mask_follows_the_default_generator_and_not_the_thread_count",
    "tests/test_native_norm.py::test_it_equals_torch_layer_norm_then_the_cast_within_rounding",
    "tests/test_native_norm.py::test_the_same_bits_on_one_thread_or_two",
    "tests/test_bahdanau_loop.py::test_the_c_score_equals_torch_in_float32_within_rounding",
    "tests/test_bahdanau_loop.py::test_the_c_score_gives_the_same_bits_on_one_thread_or_two_and_takes_empty_batches",
    "tests/test_bahdanau_loop.py::test_under_bf16_autocast_it_is_as_close_to_float64_as_bf16_allows",
]


# tests of the build and its cache, not of the kernels: each compiles the library again into a folder of its own
# (~20 s a build with the sanitizers, most of that run's time); the runs below build it once into their cache
BUILD_TESTS = [
    "tests/test_native.py::test_the_library_is_built_once_into_the_cache_folder",
    "tests/test_native.py::test_the_kernels_compile_wherever_there_is_a_compiler",
]


def _asan_runtime() -> str | None:
    cc = build._compiler()
    if cc is None or "gcc" not in Path(cc).name and "cc" != Path(cc).name:
        return None
    found = subprocess.run([cc, "-print-file-name=libasan.so"], capture_output=True, text=True).stdout.strip()
    return found if found and os.path.isabs(found) and os.path.exists(found) else None


def run_kernel_tests(tmp_path: Path, flags: str, extra_env: dict[str, str]) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "NMT_CACHE": str(tmp_path / "cache"),
        "NMT_NATIVE_FLAGS": flags,
        "OMP_NUM_THREADS": "1",
        **extra_env,
    }
    command = [sys.executable, "-m", "pytest", "-q", "-x", "-rs", "-p", "no:cacheprovider", *SANITIZED]
    command += [f"--deselect={test}" for test in BUILD_TESTS]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert list((tmp_path / "cache").glob("kernels-*.so")), (done.stdout + done.stderr)[-3000:]  # built with `flags`
    return done


@compiler
@pytest.mark.skipif(_asan_runtime() is None, reason="no AddressSanitizer runtime with this compiler")
def test_the_kernel_tests_pass_under_address_and_undefined_behaviour_sanitizers(tmp_path):
    """The kernel tests again in a process whose library is built with -fsanitize=address,undefined (any error
    aborts: -fno-sanitize-recover), the ASan runtime preloaded into Python: an out-of-bounds read or write, a
    use after free, a signed overflow or a misaligned access in the C fails this test."""
    done = run_kernel_tests(
        tmp_path,
        "-Werror -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer",
        {
            "LD_PRELOAD": _asan_runtime(),
            "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1:allocator_may_return_null=1",
            "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1",
        },
    )
    tail = (done.stdout + done.stderr)[-3000:]
    assert done.returncode == 0, tail
    assert "passed" in done.stdout and "ERROR: AddressSanitizer" not in tail and "runtime error" not in tail


@compiler
@pytest.mark.skipif(shutil.which("gcc") is None or "avx512f" not in cpu_info("flags"), reason="an AVX-512 CPU")
def test_the_portable_kernels_pass_where_the_cpu_has_avx512(tmp_path):
    """The kernels' portable C (what a CPU without AVX-512 runs: every #ifdef __AVX512F__ branch left out) built
    and tested on this AVX-512 machine, so neither build ships untested from a machine of one kind."""
    done = run_kernel_tests(tmp_path, "-Werror -mno-avx512f", {"NMT_INT8_REFERENCE": "1"})
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert "VNNI" not in done.stdout, done.stdout[-3000:]  # the int8 kernel tests ran, through the C reference


@built
@pytest.mark.skipif(native.vnni(), reason="this build has the VNNI kernels: the portable test runs the reference")
def test_the_int8_kernels_run_through_their_c_reference_where_the_cpu_has_no_vnni(tmp_path):
    """On a CPU without AVX-512 VNNI the int8 kernels (vnni_linear, a layer's, the encoder's and the decoder step's
    int8 paths) would never run, and a wrong packing or scaling in them could ship green: their portable C
    reference (NMT_INT8_REFERENCE=1) runs the same tests here, held to torch's int8 path bit for bit."""
    done = run_kernel_tests(tmp_path, "-Werror", {"NMT_INT8_REFERENCE": "1"})
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert "VNNI" not in done.stdout, done.stdout[-3000:]
