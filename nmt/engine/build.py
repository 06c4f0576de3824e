"""The native kernels' library: compiled from csrc/ (kernels.c, kernels.h) with the machine's C compiler on first
use, cached, checked, and loaded through ctypes (nmt.engine.native wraps its functions).

    library()    the loaded kernels, or None: then every caller uses its torch operators (never a requirement)
    describe()   one line: which library decodes here, or why none does

Build: `FLAGS` (-O3 -march=native, no fused multiply-add: the int8 kernels must equal torch's chains bit for bit;
-Wall -Wextra), with OpenMP where the compiler has it, plus $NMT_NATIVE_FLAGS (the tests add -Werror; the
sanitizer test -fsanitize=address,undefined). A build that fails prints one warning line (the compiler's first
error) and leaves its whole output in the cache folder (build-KEY.log); decoding goes on without the kernels.

Cache: $NMT_CACHE, else $XDG_CACHE_HOME/nmt, else ~/.cache/nmt, made 0700. A folder or library that is not the
user's own, or that others may write, is refused (one warning line, no kernels): another user could plant a
library there. The library's name is a hash of the sources, the compiler and its version, the flags and what
-march=native depends on (the CPU's model and flags on x86, its implementer, part and features on ARM); its
SHA-256 is recorded beside it (KEY.sha256) and checked before it is loaded, and a library that fails the check is
built again. Writes go to a temporary name renamed into place, so processes that start together (workers) never
load a half-written file.

Load: every function's ctypes signature (`SIGNATURES`), then the structs' layouts: the C reports its structs'
sizes and offsets (nmt_layout) and they must equal the ctypes copies' (`LAYOUT`), else the kernels are disabled
with one warning line (a wrong offset would be silent memory corruption). NMT_INT8_REFERENCE=1 (the tests' switch)
turns on the int8 kernels' portable C reference where the build has no VNNI, so that a CPU without VNNI still runs
every int8 path of the kernels (in scalar C: slower than torch's int8 path, which such a build otherwise uses).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

from nmt.engine.structs import LAYOUT

CSRC = Path(__file__).with_name("csrc")
SOURCES = ("kernels.c", "loss.c", "dropout.c", "layernorm.c", "additive.c")
HEADERS = ("kernels.h", "vmath.h", "bf16.h")
FLAGS = [
    "-O3",
    "-march=native",
    "-ffp-contract=off",
    "-fno-math-errno",
    "-shared",
    "-fPIC",
    "-Wall",
    "-Wextra",
    "-Wno-unknown-pragmas",  # the OpenMP pragmas, in the build without OpenMP
]
OPENMP = ["-fopenmp"]  # tried first: fp32 products on torch's threads (its libgomp.so.1, already loaded, is the
# one the library's libgomp.so.1 resolves to); without: single-threaded

_I64 = ctypes.c_int64
_P = ctypes.c_void_p
_F = ctypes.c_float
_INT = ctypes.c_int
_LAYER_STEP = [_P, _P, _I64, _P, _P, _I64, _I64, _I64, _P, _P, _I64, _P, _I64, _P, _P, _P, _I64, _P]
SIGNATURES: dict[str, tuple[list, type | None]] = {  # name -> (argument types, return type)
    "quantize_rows": ([_P, _I64, _I64, _P, _P], None),
    "dequantize": ([_P, _I64, _I64, _P, _P, _P, _P], None),
    "unit_rows_pinned": ([_P, _I64, _I64, _P, _P], None),
    "vnni_linear": ([_P, _I64, _I64, _I64, _P, _P, _P, _P, _P], ctypes.c_int),
    "nmt_int8_reference": ([ctypes.c_int], ctypes.c_int),
    "fp32_linear": ([_P, _I64, _I64, _I64, _P, _P, _P], ctypes.c_int),
    "has_amx": ([], ctypes.c_int),
    "log_softmax_topk": ([_P, _I64, _I64, _I64, _P, _I64, _P, _P], ctypes.c_int),
    "row_argmax": ([_P, _I64, _I64, _P, _I64, _P], ctypes.c_int),
    "layer_step32": (_LAYER_STEP, _INT),
    "layer_step": (_LAYER_STEP, _INT),
    "attend": ([_P, _I64, _I64, _I64, _I64, _I64, _P, _P, _I64, _I64, _I64, _I64, _P, _I64, _F, _P, _P, _P], _INT),
    "self_attend": ([_P, _I64, _I64, _I64, _I64, _P, _P, _I64, _I64, _I64, _F, _P, _P, _I64], ctypes.c_int),
    "encoder_forward": (
        [_P, _I64, ctypes.c_int, _P, _P, _I64, _F, _P, _P, _I64, _I64, _P, _P, _P, _P, _F],
        ctypes.c_int,
    ),
    "decoder_step": (
        [_P, _I64, ctypes.c_int, _P, _P, _I64, _F, _P, _P, _I64, _P, _P, _I64, _I64, _I64, _P, _P, _I64, _P, _I64, _P,
         _P, _P, _I64, _P, _P, _P, _F, _P, _I64],
        ctypes.c_int,
    ),
    "nmt_layout": ([_P, _I64], _I64),
    "nmt_indices_within": ([_P, _I64, _I64, _I64, _I64], _INT),
    "xent_forward": ([_P, _INT, _I64, _I64, _P, _F, _P, _P], _INT),
    "xent_backward": ([_P, _INT, _I64, _I64, _P, _F, _P, _F, _P], _INT),
    "dropout_apply": ([_P, _INT, _I64, ctypes.c_uint64, ctypes.c_int32, _F, _P], _INT),
    "layer_norm_bf16_forward": ([_P, _I64, _I64, _P, _P, _F, _P, _P, _P], _INT),
    "layer_norm_bf16_backward": ([_P, _P, _INT, _I64, _I64, _P, _P, _P, _P, _P, _P, _P], _INT),
    "additive_scores_forward": ([_P, _I64, _P, _P, _I64, _I64, _I64, _P], _INT),
    "additive_scores_backward": ([_P, _I64, _P, _P, _P, _I64, _I64, _I64, _P, _P, _P], _INT),
}  # fmt: skip

_WARNED: set[str] = set()
LOG = logging.getLogger("nmt.engine")  # which library decodes, once per process (INFO)


def warn(message: str) -> None:
    """One line on stderr, once per process."""
    if message not in _WARNED:
        _WARNED.add(message)
        print(f"warning: nmt native kernels: {message}", file=sys.stderr)


def cache_dir() -> Path:
    if os.environ.get("NMT_CACHE"):
        return Path(os.environ["NMT_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "nmt"


def sources_text() -> str:
    """The kernels' C source and headers, as the cache key hashes them."""
    return "\n".join(f"// {name}\n{(CSRC / name).read_text()}" for name in (*HEADERS, *SOURCES))


def cpu_key() -> str:
    """What -march=native depends on: on x86 the CPU's model and flags; on ARM its implementer, part, variant and
    features (a library built for one core may hold instructions another lacks: SIGILL, not a fallback)."""
    from nmt.runtime import cpu_info

    fields = ("model name", "flags", "CPU implementer", "CPU architecture", "CPU variant", "CPU part", "Features")
    return " | ".join([platform.machine(), *(cpu_info(field) for field in fields)])


def _compiler() -> str | None:
    for name in (os.environ.get("CC"), "gcc", "cc", "clang"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


@functools.cache
def compiler_version(compiler: str) -> str:
    """The compiler's `--version` line (in the cache key: another compiler version builds another library)."""
    try:
        done = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (done.stdout or done.stderr).strip().splitlines()[0] if (done.stdout or done.stderr).strip() else "unknown"


def extra_flags() -> list[str]:
    """$NMT_NATIVE_FLAGS: flags added to every build (tests: -Werror; the sanitizer run: -fsanitize=...)."""
    return shlex.split(os.environ.get("NMT_NATIVE_FLAGS", ""))


def key(compiler: str) -> str:
    parts = [sources_text(), compiler, compiler_version(compiler), " ".join(FLAGS + OPENMP + extra_flags()), cpu_key()]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def private(path: Path, what: str) -> bool:
    """Whether `path` is this user's own and writable by nobody else; else one warning line, and False."""
    try:
        info = path.stat()
    except OSError as error:
        warn(f"{what} {path}: {error.strerror}; decoding uses torch's operators")
        return False
    if hasattr(os, "getuid") and info.st_uid != os.getuid():
        warn(f"{what} {path} belongs to another user (uid {info.st_uid}); not used, decoding uses torch's operators")
        return False
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        warn(
            f"{what} {path} is writable by other users (mode {stat.filemode(info.st_mode)}); not used, decoding "
            "uses torch's operators (chmod go-w it, or set NMT_CACHE to a folder of your own)"
        )
        return False
    return True


def secure_folder(folder: Path) -> bool:
    """The cache folder, made 0700 where it does not exist; whether it may hold the library."""
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as error:
        warn(f"cache folder {folder}: {error.strerror}; decoding uses torch's operators")
        return False
    return private(folder, "cache folder")


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def build(folder: Path | None = None) -> Path | None:
    """The compiled library's path (built now if not cached, or if its recorded hash does not match), or None where
    it cannot be built or kept here (no compiler, a failed build, a cache folder others may write)."""
    compiler = _compiler()
    if compiler is None:
        return None
    folder = folder or cache_dir()
    if not secure_folder(folder):
        return None
    name = key(compiler)
    path, recorded = folder / f"kernels-{name}.so", folder / f"kernels-{name}.sha256"
    if path.exists() and recorded.exists():
        if not private(path, "cached library"):
            return None
        if recorded.read_text().strip() == digest(path):
            return path
        warn(f"{path}: its content does not match the hash recorded when it was built; building it again")
    try:
        with tempfile.TemporaryDirectory(dir=folder) as tmp:
            out = Path(tmp) / "kernels.so"
            logs = []
            for flags in (FLAGS + OPENMP, FLAGS):
                command = [compiler, *flags, *extra_flags(), "-I", str(CSRC)]
                command += [*(str(CSRC / source) for source in SOURCES), "-o", str(out), "-lm"]
                done = subprocess.run(command, capture_output=True, text=True, timeout=300)
                logs.append(f"$ {shlex.join(command)}\n{done.stdout}{done.stderr}(exit {done.returncode})\n")
                if done.returncode == 0:
                    break
            else:
                log = folder / f"build-{name}.log"
                log.write_text("".join(logs))
                lines = [line for line in logs[0].splitlines() if not line.startswith("$ ")]
                first = next((line for line in lines if "error" in line), lines[0] if lines else "no output")
                warn(
                    f"the build failed ({first.strip()}); decoding uses torch's operators; the compiler's output: {log}"
                )
                return None
            tmp_hash = Path(tmp) / "kernels.sha256"
            tmp_hash.write_text(digest(out) + "\n")
            os.replace(out, path)
            os.replace(tmp_hash, recorded)
    except subprocess.TimeoutExpired:
        warn(f"the build took over 300 s ({compiler}); decoding uses torch's operators")
        return None
    except OSError as error:
        warn(f"cache folder {folder}: {error.strerror}; decoding uses torch's operators")
        return None
    return path


def layout_mismatch(lib: ctypes.CDLL) -> str | None:
    """None when the C structs' sizes and offsets equal their ctypes copies' (nmt.engine.structs.LAYOUT: each
    struct's size, then its fields' offsets); else what differs."""
    want: list[tuple[str, int]] = []
    for struct, fields in LAYOUT:
        want.append((f"sizeof({struct.__name__})", ctypes.sizeof(struct)))
        want += [(f"{struct.__name__}.{field}", getattr(struct, field).offset) for field in fields]
    got = (ctypes.c_int64 * len(want))()
    count = lib.nmt_layout(got, len(want))
    for (name, expected), found in zip(want, got[: min(count, len(want))]):
        if found != expected:
            return f"{name}: {found} in C, {expected} in Python"
    if count != len(want):
        return f"the C reports {count} sizes and offsets, Python expects {len(want)}"
    return None


def load() -> tuple[ctypes.CDLL | None, str]:
    """The kernels, or None (no compiler, a failed build, a refused cache, a layout mismatch, NMT_NATIVE=0), and one
    line saying which library it is or why there is none. Every call builds or loads anew: use `library()`."""
    if os.environ.get("NMT_NATIVE", "1") == "0":
        return None, "off (NMT_NATIVE=0): torch's operators"
    path = build()
    if path is None:
        return None, "none (no compiler, a failed build or a refused cache folder): torch's operators"
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as error:
        warn(f"{path} does not load ({error}); decoding uses torch's operators")
        return None, "none (the library does not load): torch's operators"
    for name, (args, result) in SIGNATURES.items():
        function = getattr(lib, name)
        function.argtypes, function.restype = args, result
    mismatch = layout_mismatch(lib)
    if mismatch is not None:
        warn(f"the C structs and their Python copies differ ({mismatch}); kernels disabled, torch's operators used")
        return None, f"disabled (struct layout: {mismatch}): torch's operators"
    line = f"{path.name} ({compiler_version(_compiler() or 'cc')})"
    if os.environ.get("NMT_INT8_REFERENCE") == "1":  # the tests' switch: int8 kernels in portable C without VNNI
        lib.nmt_int8_reference(1)
        line += ", int8 reference on (NMT_INT8_REFERENCE=1)"
    LOG.info("native kernels: %s from %s", line, path.parent)
    return lib, line


@functools.cache
def _loaded() -> tuple[ctypes.CDLL | None, str]:
    return load()


def library() -> ctypes.CDLL | None:
    """The kernels of this process (built or loaded once), or None: then callers use their torch operators."""
    return _loaded()[0]


def describe() -> str:
    """Which native library decodes in this process, or why none does."""
    return _loaded()[1]
