"""Request batching: concurrent requests wait briefly in a queue and are decoded together.

The first request of a batch waits at most `max_wait` seconds for others to join it, counted from its
arrival or from the end of the previous batch, whichever is later (so the clients that batch just answered
can join with their next request, rather than every other batch holding half of them); the batch closes
sooner once its requests hold `max_lines` lines (a larger request goes alone). The batch is handed to
`work` in one worker thread, so the event loop keeps accepting requests (and answering /health) while
the model runs, and the next batch gathers meanwhile. `work` returns one outcome per request, in order:
its result, or the exception it raised, which only that request's caller receives.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from dataclasses import dataclass
from typing import Any


@dataclass
class Job:
    payload: Any  # what `work` reads
    size: int  # lines, counted against max_lines
    future: asyncio.Future
    arrived: float  # the event loop's clock


class Batcher:
    """A queue of jobs, gathered into batches and run by `work(payloads) -> outcomes` in a worker thread."""

    def __init__(self, work: Callable[[list[Any]], list[Any]], max_wait: float, max_lines: int):
        self.work, self.max_wait, self.max_lines = work, max_wait, max_lines
        self.pending: deque[Job] = deque()
        self.running: list[Job] = []  # the batch in the worker thread
        self.task: asyncio.Task | None = None
        self.batches = self.jobs = 0  # counted for /health
        self.busy = 0.0  # seconds the worker thread spent in `work`
        self.busy_cpu = 0.0  # of which CPU seconds (the rest it waited for a core or the GIL)
        self.done = 0.0  # when the last batch ended (the event loop's clock)

    def start(self) -> None:
        """Start gathering batches on the running event loop (again after `stop`, on another loop too)."""
        self.arrived = asyncio.Event()
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nmt-decode")
        self.task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        """Stop gathering, let the worker thread finish its batch, and fail every job left unanswered."""
        if self.task is None:
            return
        self.task.cancel()
        with suppress(asyncio.CancelledError):
            await self.task
        self.task = None
        await asyncio.get_running_loop().run_in_executor(None, self.executor.shutdown)
        for job in [*self.running, *self.pending]:
            if not job.future.done():
                job.future.set_exception(RuntimeError("the server is shutting down"))
        self.pending.clear()

    async def submit(self, payload: Any, size: int) -> Any:
        """Queue one job and wait for its outcome (an exception from `work` is raised here)."""
        if self.task is None:
            raise RuntimeError("the batcher is not running (start() it on the server's event loop)")
        loop = asyncio.get_running_loop()
        job = Job(payload, size, loop.create_future(), loop.time())
        self.pending.append(job)
        self.arrived.set()
        return await job.future

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._gather(loop)
            batch = self._take()
            if not batch:
                continue
            self.batches, self.jobs, self.running = self.batches + 1, self.jobs + len(batch), batch
            started = loop.time()
            try:
                outcomes = await loop.run_in_executor(self.executor, self._timed_work, [job.payload for job in batch])
            except Exception as err:  # a bug in `work` itself: every job of the batch gets the error
                outcomes = [err] * len(batch)
            self.done = loop.time()
            self.busy += self.done - started
            for job, outcome in zip(batch, outcomes):
                if job.future.done():  # the caller went away
                    continue
                if isinstance(outcome, Exception):
                    job.future.set_exception(outcome)
                else:
                    job.future.set_result(outcome)
            self.running = []

    def _timed_work(self, payloads: list[Any]) -> list[Any]:
        """`work`, counting the worker thread's CPU time."""
        started = time.thread_time()
        try:
            return self.work(payloads)
        finally:
            self.busy_cpu += time.thread_time() - started

    async def _gather(self, loop: asyncio.AbstractEventLoop) -> None:
        """Wait for a first job, then max_wait past its arrival (or the last batch's end),
        or until max_lines lines are queued."""
        while not self.pending:
            self.arrived.clear()
            await self.arrived.wait()
        deadline = max(self.pending[0].arrived, self.done) + self.max_wait
        while sum(job.size for job in self.pending) < self.max_lines and (left := deadline - loop.time()) > 0:
            self.arrived.clear()
            with suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.arrived.wait(), left)

    def _take(self) -> list[Job]:
        """The oldest jobs that fit in max_lines (at least one); jobs whose caller went away are dropped."""
        batch: list[Job] = []
        lines = 0
        while self.pending and (not batch or lines + self.pending[0].size <= self.max_lines):
            job = self.pending.popleft()
            if not job.future.done():
                batch.append(job)
                lines += job.size
        return batch
