"""Where the server's searches run: threads of the server process, or worker processes (serve.workers=N).

Both take (lane, (model, beam, nbest), batch of (source ids, prefix ids), cancel event) and return each sentence's
hypotheses. A streamed line comes as (lane, StreamKey, [StreamJob], cancel event): it is decoded alone, and its
decoding steps' events (`step_record`, JSON-ready) go to the job's `emit` as they are made, from the lane's thread
(or, from a worker process, through the pipe); the search never waits for the client that reads them.
A search stops at its next decoding step once its cancel event is set: the model is wrapped so that its `step`
checks the event first and raises `Cancelled`, which needs nothing from the search itself (greedy and beam alike).

With workers=N each of the N processes (started with "spawn", as nmt-translate's workers are) loads every model
once before the server answers, runs one batch at a time with the server's torch threads, and reads a shared
number that names the batch to abandon; a process that dies is started again, and only its batch fails.
"""

from __future__ import annotations

import multiprocessing
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from nmt.config import DecodeConfig
from nmt.search import Hypothesis
from nmt.serve.scheduler import Cancelled
from nmt.streaming import StreamEvent, stream_steps
from nmt.translation import Translator


class Stoppable:
    """A model whose step() raises Cancelled once `stop()` is true; everything else is the model's own."""

    def __init__(self, model: Any, stop: Callable[[], bool]):
        self._model, self._stop = model, stop

    def step(self, *args: Any, **kwargs: Any) -> Any:
        if self._stop():
            raise Cancelled()
        return self._model.step(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)


def search(translator: Translator, beam: int, nbest: int, payloads: list[Any], stop: Callable[[], bool]):
    """The hypotheses of each (source ids, prefix ids[, constraint phrases, avoided phrases]) of `payloads` (in
    order), in the translator's batches of decode.batch_tokens (and of one prefix length)."""
    src_ids = [p[0] for p in payloads]
    prefix_ids = [p[1] for p in payloads] if any(p[1] for p in payloads) else None
    needs = [p[2] for p in payloads] if any(len(p) > 2 and p[2] for p in payloads) else None
    avoids = [p[3] for p in payloads] if any(len(p) > 3 and p[3] for p in payloads) else None
    t = Translator(
        Stoppable(translator.model, stop),
        translator.tokenizer,
        replace(translator.decode, beam=beam, nbest=nbest),
        translator.device,
        warn=lambda message: None,
    )
    found: list[list[Hypothesis]] = [[] for _ in src_ids]
    with torch.inference_mode():
        for batch in t.batches(src_ids, list(range(len(src_ids))), prefix_ids):
            prefixes = [prefix_ids[i] for i in batch] if prefix_ids else None
            need = [needs[i] for i in batch] if needs else None
            avoid = [avoids[i] for i in batch] if avoids else None
            for i, hyps in zip(batch, t.search([src_ids[i] for i in batch], prefixes, need, avoid)):
                found[i] = hyps
    return found


FLUSH_S = 0.02  # a stream's events go to `emit` together when they come sooner than this after the last hand-over
# (the first at once, the last when the search ends): each hand-over wakes the server's event loop, whose thread then
# takes the GIL from the search's. Handing over every step took ~1.3x as long for a tiny toy Transformer's streams
# (steps under 1 ms; 2 cores, busy); a step slower than this is handed over as it comes.


@dataclass(frozen=True)
class StreamKey:
    """The scheduler key of a streamed line."""

    model: str
    beam: int


@dataclass
class StreamJob:
    """A streamed line: (source ids, prefix ids, attention wanted, finished_only), and where its events go."""

    payload: tuple[list[int], list[int], bool, bool]
    emit: Callable[[list[dict[str, Any]]], None]  # receives step records in order, one or more at a time


def step_record(event: StreamEvent, source: list[str] | None) -> dict[str, Any]:
    """A step event as the stream sends it: the hypothesis' tokens and text, `keep`, and the attention rows from
    `keep` on (rounded to 4 decimals, as /v1/translate's); `source` (the source pieces, then </s>) in the line's
    first event that has attention."""
    record: dict[str, Any] = {
        "step": event.step,
        "tokens": event.tokens,
        "text": event.text,
        "keep": event.keep,
        "finished": event.finished,
    }
    if event.attention is not None:
        record["attention"] = np.round(event.attention[event.keep :].astype(np.float64), 4).tolist()
        if source is not None:
            record["src"] = source
    return record


def stream(translator: Translator, beam: int, payload: tuple, stop: Callable[[], bool], emit) -> list[Hypothesis]:
    """Decode one line as `search` does (alone), handing each step's record to `emit` (see FLUSH_S); its
    hypotheses."""
    src_ids, prefix_ids, attention, finished_only = payload
    t = Translator(
        Stoppable(translator.model, stop),
        translator.tokenizer,
        replace(translator.decode, beam=beam, nbest=1),
        translator.device,
        warn=lambda message: None,
    )
    pieces = t.tokenizer.src
    source = [pieces.id_to_piece(i) for i in src_ids] + ["</s>"] if attention else None
    steps = stream_steps(t, src_ids, prefix_ids or None, attention, finished_only)
    ready: list[dict[str, Any]] = []
    handed = -FLUSH_S
    while True:
        try:
            event = next(steps)
        except StopIteration as done:
            if ready:
                emit(ready)
            return done.value
        if event.final:  # the final event is the line's result, which the server builds as /v1/translate's
            continue
        ready.append(step_record(event, source))
        source = None
        if time.monotonic() - handed >= FLUSH_S:
            emit(ready)
            ready, handed = [], time.monotonic()


class ThreadLanes:
    """Searches in the server's own threads, on the models it loaded."""

    def __init__(self, translators: dict[str, Translator]):
        self.translators = translators

    def __call__(self, lane: int, key: Hashable, src_ids: list[Any], cancel: threading.Event) -> list[Any]:
        if isinstance(key, StreamKey):
            (job,) = src_ids
            return [stream(self.translators[key.model], key.beam, job.payload, cancel.is_set, job.emit)]
        name, beam, nbest = key  # type: ignore[misc]
        return search(self.translators[name], beam, nbest, src_ids, cancel.is_set)

    def close(self) -> None:
        pass


# --- worker processes -------------------------------------------------------------------------------------------
Packed = list[tuple[list[int], float, float, np.ndarray]]


def _pack(found: list[list[Hypothesis]]) -> list[Packed]:
    return [[(h.tokens, h.score, h.norm_score, h.attention.numpy()) for h in hyps] for hyps in found]


def _unpack(packed: list[Packed]) -> list[list[Hypothesis]]:
    return [[Hypothesis(t, s, n, torch.from_numpy(a)) for t, s, n, a in hyps] for hyps in packed]


def _worker(conn, checkpoints: dict[str, str], decode: DecodeConfig, device: str, threads: int | None, abandon) -> None:
    """A search process: load the models, say "ready", then search batches until the pipe closes."""
    from nmt.api import load_translator
    from nmt.memory import tune_allocator

    tune_allocator()
    try:
        translators = {name: load_translator(path, decode, device, threads)[0] for name, path in checkpoints.items()}
    except BaseException as err:  # noqa: BLE001 - the parent reports it
        conn.send(("failed", f"{type(err).__name__}: {err}"))
        return
    conn.send(("ready", None))
    while True:
        try:
            job, key, src_ids = conn.recv()
        except (EOFError, OSError):
            return
        stop = lambda job=job: abandon.value == job  # noqa: E731
        try:
            if isinstance(key, StreamKey):
                emit = lambda record: conn.send(("event", record))  # noqa: E731
                found = [stream(translators[key.model], key.beam, src_ids[0], stop, emit)]
            else:
                found = search(translators[key[0]], key[1], key[2], src_ids, stop)
            conn.send(("ok", _pack(found)))
        except Cancelled:
            conn.send(("cancelled", None))
        except Exception as err:  # noqa: BLE001 - this batch fails, the process goes on
            conn.send(("error", f"{type(err).__name__}: {err}"))


class LaneFailed(RuntimeError):
    pass


class ProcessLanes:
    """`lanes` processes, each holding every model; lane i searches in process i."""

    def __init__(self, checkpoints: dict[str, str], decode: DecodeConfig, device: str, threads: int | None, lanes: int):
        self.args = (checkpoints, decode, device, threads)
        self.context = multiprocessing.get_context("spawn")
        self.jobs = 0
        self.procs: list[Any] = [None] * lanes
        self.conns: list[Any] = [None] * lanes
        self.abandon = [self.context.Value("q", -1, lock=False) for _ in range(lanes)]
        for lane in range(lanes):  # start them all, then wait: they load in parallel
            self._spawn(lane)
        for lane in range(lanes):
            self._ready(lane)

    def _spawn(self, lane: int) -> None:
        parent, child = self.context.Pipe()
        proc = self.context.Process(
            target=_worker, args=(child, *self.args, self.abandon[lane]), daemon=True, name=f"nmt-serve-lane{lane}"
        )
        proc.start()
        child.close()
        self.procs[lane], self.conns[lane] = proc, parent

    def _ready(self, lane: int) -> None:
        try:
            kind, message = self.conns[lane].recv()
        except EOFError:
            kind, message = "failed", f"exit code {self.procs[lane].exitcode}"
        if kind != "ready":
            self.close()
            raise LaneFailed(f"serve.workers: a search process could not load the models ({message})")

    def __call__(self, lane: int, key: Hashable, src_ids: list[Any], cancel: threading.Event) -> list[Any]:
        self.jobs += 1
        job = self.jobs
        conn = self.conns[lane]
        emit = src_ids[0].emit if isinstance(key, StreamKey) else None  # a stream's events come back as they are made
        try:
            conn.send((job, key, [p.payload for p in src_ids] if emit else src_ids))
            while True:
                while not conn.poll(0.02):
                    if cancel.is_set():
                        self.abandon[lane].value = job
                    if not self.procs[lane].is_alive():
                        raise EOFError
                kind, value = conn.recv()
                if kind != "event":
                    break
                emit(value)
        except (EOFError, OSError, BrokenPipeError):
            code = self.procs[lane].exitcode
            self._spawn(lane)  # the next batch gets a fresh process
            self._ready(lane)
            raise LaneFailed(f"a search process died (exit code {code}); it was started again") from None
        if kind == "cancelled":
            raise Cancelled()
        if kind == "error":
            raise LaneFailed(value)
        return _unpack(value)

    def close(self) -> None:
        for conn, proc in zip(self.conns, self.procs):
            if conn is not None:
                conn.close()
            if proc is not None:
                proc.join(timeout=5)
                if proc.is_alive():
                    proc.terminate()
