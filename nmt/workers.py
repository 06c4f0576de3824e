"""Searching batches in several processes, each with its own copy of the model (nmt-translate workers=N).

On a CPU a decoding step is many small operations that two threads of one process share poorly: two
single-threaded processes, each searching whole batches, translate about 1.3x (beam) to 1.5x (greedy)
more sentences per second than one process with two threads (README, "Decoding speed"), as inference
engines' "inter_threads" replicas do. The parent reads, tokenizes, sorts and writes; the workers search
the batches it hands out, in order of submission, so the output is the same as with one process.

Workers are started with "spawn" (a forked copy of a process that has run OpenMP threads can hang) and
each loads the checkpoint itself; the pool is ready when all of them have (otherwise one worker could take the
first batches while another is still loading its model on the same cores).
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Iterable, Iterator

import numpy as np
import torch

from nmt.config import DecodeConfig
from nmt.search import Hypothesis

_translator = None  # the worker process's own Translator
_failure: BaseException | None = (
    None  # why it could not be made (raised by the first search: a failing initializer would be restarted forever)
)
_barrier = None  # the pool's start barrier (`_ready`)

Packed = list[
    tuple[list[int], float, float, np.ndarray]
]  # a sentence's hypotheses, attention as numpy (cheap to pickle)


def _start(checkpoint: str, decode: DecodeConfig, device: str, threads: int, barrier=None) -> None:
    global _translator, _failure, _barrier
    from nmt.api import load_translator
    from nmt.memory import tune_allocator

    _barrier = barrier
    tune_allocator()
    try:
        _translator, _ = load_translator(checkpoint, decode, device, threads)
    except BaseException as err:  # noqa: BLE001 - handed to the parent with the first batch
        _failure = err


def _ready(_: int) -> None:
    """Returns once every worker has started (loaded its model, or failed to): each of the pool's N calls holds its
    worker at the barrier until all N have arrived, so each worker takes exactly one."""
    import threading

    if _barrier is not None:
        try:
            _barrier.wait(timeout=3600)
        except threading.BrokenBarrierError:  # a worker that never came: searches go on as they can
            pass


def _search(job: tuple) -> list[Packed]:
    """One batch: (source ids, target prefixes, constraints, phrases to avoid; each but the first may be None)
    -> each sentence's hypotheses."""
    if _failure is not None:
        raise _failure
    with torch.inference_mode():
        found = _translator.search(*job)
    return [[(h.tokens, h.score, h.norm_score, h.attention.numpy()) for h in hyps] for hyps in found]


def _unpack(packed: list[Packed]) -> list[list[Hypothesis]]:
    return [
        [Hypothesis(tokens, score, norm, torch.from_numpy(attn)) for tokens, score, norm, attn in hyps]
        for hyps in packed
    ]


class SearchPool:
    """`workers` processes that each load the checkpoint with `threads` torch threads and search batches of source
    ids."""

    def __init__(self, checkpoint: str, decode: DecodeConfig, device: str, workers: int, threads: int):
        context = multiprocessing.get_context("spawn")
        barrier = context.Barrier(workers)
        self.pool = context.Pool(workers, initializer=_start, initargs=(checkpoint, decode, device, threads, barrier))
        self.pool.map(_ready, range(workers), chunksize=1)  # every worker has loaded its model

    def search(self, batches: Iterable[tuple]) -> Iterator[list[list[Hypothesis]]]:
        """Each batch's hypotheses per sentence, in the order of `batches` (Translator.search's arguments each);
        the workers take batches as they free up."""
        for packed in self.pool.imap(_search, batches):
            yield _unpack(packed)

    def close(self) -> None:
        self.pool.terminate()
        self.pool.join()

    def __enter__(self) -> SearchPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
