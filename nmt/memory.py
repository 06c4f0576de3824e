"""The C library's memory allocator: keep freed memory for reuse while working, give it back between chunks."""

from __future__ import annotations

import ctypes

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_MMAP_MAX = -1, -3, -4  # glibc mallopt parameters
MMAP_THRESHOLD = 32 << 20  # glibc's largest: bigger blocks are mapped and unmapped each time unless M_MMAP_MAX is 0
TRIM_THRESHOLD = 1 << 30


def tune_allocator() -> None:
    """Let glibc's malloc keep freed memory for the next tensors instead of handing it back to the system.

    By default a block over 128 KiB-32 MiB (adaptive) is mapped fresh and unmapped when freed, and free
    memory at the top of the heap is returned: every step of a search allocates its (rows, V) logits anew
    and pays a page fault per 4 KiB to touch them again. Measured with scripts/bench_decode.py: beam search
    about 10% faster. Blocks over 32 MiB, which glibc maps whatever the threshold, come from the heap too
    (M_MMAP_MAX 0): a bf16 Transformer update's 64 MiB logits and gradient cost ~35 ms of page faults each
    otherwise (scripts/bench_train.py, 2 threads: 1.12x tokens/s, peak memory ~10% higher). Memory that
    must go back (nmt-translate, after each chunk) is released explicitly by `release_freed_memory`.
    No-op where the C library is not glibc.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
        libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
        libc.mallopt(M_MMAP_MAX, 0)  # blocks over 32 MiB too (a training step's (N, V) logits and their gradient)
    except (OSError, AttributeError):
        pass


def release_freed_memory() -> None:
    """Give the memory freed so far back to the system (glibc keeps it in its heap, where blocks of varied
    tensor sizes fragment it and the resident size creeps up over a long file); no-op elsewhere."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
