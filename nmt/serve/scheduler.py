"""Fair scheduling of translation requests onto decoding lanes, with deadlines, cancellation and a bounded queue.

A request becomes a `Ticket` of lines (`Item`s, each with its cost: beam rows x source tokens). Lines wait in one
queue; whenever a lane is free, a batch is made for it:

  - the batch takes the key (model, beam, n-best) of the oldest waiting ticket it may run, and then one line from
    each waiting ticket of that key in turn, oldest first, round after round, until it holds `max_lines` lines or
    `max_cost` beam rows x source tokens. So a request of 64 lines never makes a one-line request wait for all 64:
    the small one's line goes into the next batch.
  - a line that costs more than `long_cost` is "long": it is batched only with other long lines, and only on the
    general lanes. The last lane is reserved for short lines, and takes them only while a general lane is busy with
    long ones (otherwise two batches at once would share the cores for nothing), so small requests are never held
    behind an expensive one.
  - the first line of a batch waits up to `max_wait` for others to join it (counted from its arrival or from the
    end of the previous batch, whichever is later), unless `max_lines` lines are already waiting; the lines that
    arrived during that wait then go in batches one after another, without waiting again.
  - a "solo" ticket (a streamed line, nmt.serve.streams) is a batch of its own, taken in its turn like any other
    line (by arrival, on the lanes its cost allows) and without waiting for company it could not have.

A ticket can be cancelled (its deadline passed, or its client went away): its waiting lines leave the queue, and a
running batch whose every line belongs to cancelled tickets is stopped at its next decoding step (`work` receives a
threading.Event and must raise `Cancelled` once it is set). If a batch of several requests fails, each request is
decoded again on its own, so that one request's bad line never fails another's. `submit` refuses work beyond
`max_queue_lines` waiting lines with `Overloaded`, which says when to retry.

`work(lane, key, payloads, cancel)` runs in the lane's own thread and returns one result per payload.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Callable, Hashable
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any


class Cancelled(Exception):
    """Raised by `work` when its cancel event is set: every ticket of the batch was cancelled."""


class Overloaded(Exception):
    """More lines wait than the queue holds; `retry_after` seconds is when the queue should have room again."""

    def __init__(self, waiting: int, limit: int, retry_after: int):
        super().__init__(f"{waiting} lines are waiting to be decoded (serve.max_queue_lines={limit}); retry later")
        self.retry_after = retry_after


@dataclass(eq=False)
class Ticket:
    """One request: its lines' payloads, and the future that receives their results (or the first error)."""

    key: Hashable
    future: asyncio.Future
    arrived: float
    results: list[Any] = field(default_factory=list)
    left: int = 0
    cancelled: bool = False
    solo: bool = False  # decoded alone: a batch of one line


@dataclass(eq=False)
class Item:
    ticket: Ticket
    index: int  # the line's place in the ticket
    payload: Any
    cost: int
    long: bool


@dataclass(eq=False)
class Running:
    items: list[Item]
    long: bool
    cancel: threading.Event = field(default_factory=threading.Event)


Work = Callable[[int, Hashable, list[Any], threading.Event], list[Any]]


class Scheduler:
    def __init__(
        self,
        work: Work,
        lanes: int,
        max_wait: float,
        max_lines: int,
        max_cost: int,
        long_cost: int,
        max_queue_lines: int,
    ):
        self.work, self.lanes, self.max_wait = work, max(lanes, 1), max_wait
        self.max_lines, self.max_cost, self.long_cost, self.max_queue_lines = (
            max_lines,
            max_cost,
            long_cost,
            max_queue_lines,
        )
        self.waiting: list[Item] = []  # in arrival order
        self.running: dict[int, Running] = {}  # lane -> its batch
        self.task: asyncio.Task | None = None
        self.batches = self.jobs = self.lines = 0  # counted for /health and /metrics
        self.busy = 0.0  # seconds the lanes spent in `work`
        self.busy_cpu = 0.0  # of which CPU seconds of the lane threads
        self.done = 0.0  # when the last batch ended (the event loop's clock)
        self.cut = -math.inf  # when the last wait for company ended: lines that arrived before go without waiting
        self.rate = 0.0  # lines per second of the recent batches (for Retry-After)
        self.on_batch: Callable[[int, float], None] = lambda lines, seconds: None  # metrics hook

    # --- the event loop's side ---

    def start(self) -> None:
        """Start scheduling on the running event loop (again after `stop`, on another loop too)."""
        self.wake = asyncio.Event()
        self.executors = [
            ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"nmt-lane{i}") for i in range(self.lanes + 1)
        ]
        self.task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        """Stop scheduling, stop the running batches, and fail every ticket left unanswered."""
        if self.task is None:
            return
        self.task.cancel()
        with suppress(asyncio.CancelledError):
            await self.task
        self.task = None
        for batch in self.running.values():
            batch.cancel.set()
        loop = asyncio.get_running_loop()
        for executor in self.executors:
            await loop.run_in_executor(None, executor.shutdown)
        for item in [*self.waiting, *(i for b in self.running.values() for i in b.items)]:
            if not item.ticket.future.done():
                item.ticket.future.set_exception(Cancelled("the server is shutting down"))
        self.waiting.clear()
        self.running.clear()

    @property
    def waiting_lines(self) -> int:
        return len(self.waiting)

    def submit(self, key: Hashable, payloads: list[Any], costs: list[int], solo: bool = False) -> Ticket:
        """Queue one request's lines; the ticket's future gets their results in order. Raises Overloaded.
        solo: each line is a batch of its own (a streamed line)."""
        if self.task is None:
            raise RuntimeError("the scheduler is not running (start() it on the server's event loop)")
        if payloads and len(self.waiting) + len(payloads) > self.max_queue_lines:
            seconds = (len(self.waiting) + len(payloads)) / self.rate if self.rate > 0 else 1.0
            raise Overloaded(len(self.waiting), self.max_queue_lines, min(60, max(1, math.ceil(seconds))))
        loop = asyncio.get_running_loop()
        ticket = Ticket(key, loop.create_future(), loop.time(), [None] * len(payloads), len(payloads), solo=solo)
        if not payloads:
            ticket.future.set_result([])
            return ticket
        self.jobs += 1
        self.waiting.extend(Item(ticket, i, p, c, c > self.long_cost) for i, (p, c) in enumerate(zip(payloads, costs)))
        self.wake.set()
        return ticket

    def cancel(self, ticket: Ticket, error: BaseException | None = None) -> None:
        """Drop a ticket's waiting lines; stop a running batch that served only cancelled tickets."""
        ticket.cancelled = True
        self.waiting = [item for item in self.waiting if item.ticket is not ticket]
        for batch in self.running.values():
            if all(item.ticket.cancelled for item in batch.items):
                batch.cancel.set()
        if not ticket.future.done():
            ticket.future.set_exception(error or Cancelled())
            ticket.future.exception()  # retrieved: a cancelled ticket's error is nobody's to read
        self.wake.set()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            lane = self._free_lane()
            if lane is None or not self.waiting:
                self.wake.clear()
                await self.wake.wait()
                continue
            first = self.waiting[0].ticket.arrived
            deadline = max(first, self.done) + self.max_wait
            alone = self.waiting[0].ticket.solo  # no company to wait for
            if (
                not alone
                and first > self.cut
                and len(self.waiting) < self.max_lines
                and (left := deadline - loop.time()) > 0
            ):
                self.wake.clear()
                with suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self.wake.wait(), left)
                continue
            if first > self.cut:
                self.cut = loop.time()
            batch = self._take(lane)
            if batch is None:  # nothing this lane may run now
                self.wake.clear()
                await self.wake.wait()
                continue
            self.running[lane] = batch
            self.batches += 1
            loop.create_task(self._execute(lane, batch))

    def _free_lane(self) -> int | None:
        """A general lane if one is free; else the reserved one, while a general lane runs long lines."""
        for lane in range(self.lanes):
            if lane not in self.running:
                return lane
        reserved = self.lanes
        if reserved not in self.running and any(b.long for b in self.running.values()):
            return reserved
        return None

    def _take(self, lane: int) -> Running | None:
        """The next batch for `lane` (see the module's docstring), taken out of the queue."""
        allowed = [item for item in self.waiting if lane < self.lanes or not item.long]
        if not allowed:
            return None
        first = allowed[0]
        if first.ticket.solo:
            self.waiting = [item for item in self.waiting if item is not first]
            return Running([first], first.long)
        same = [item for item in allowed if item.ticket.key == first.ticket.key and item.long == first.long]
        by_ticket: dict[Ticket, list[Item]] = {}
        for item in same:
            by_ticket.setdefault(item.ticket, []).append(item)
        queues = list(by_ticket.values())
        chosen: list[Item] = []
        cost = 0
        while queues and len(chosen) < self.max_lines:
            for queue in list(queues):
                item = queue[0]
                if chosen and (len(chosen) >= self.max_lines or cost + item.cost > self.max_cost):
                    queues = []
                    break
                chosen.append(item)
                cost += item.cost
                queue.pop(0)
                if not queue:
                    queues.remove(queue)
        taken = set(map(id, chosen))
        self.waiting = [item for item in self.waiting if id(item) not in taken]
        return Running(chosen, first.long)

    async def _execute(self, lane: int, batch: Running) -> None:
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            outcomes = await loop.run_in_executor(self.executors[lane], self._isolated, lane, batch)
        except Exception as err:  # a bug in `work` itself: every line of the batch gets the error
            outcomes = [err] * len(batch.items)
        self.done = loop.time()
        seconds = self.done - started
        self.busy += seconds
        self.lines += len(batch.items)
        if seconds > 0:
            recent = len(batch.items) / seconds * (self.lanes if not batch.long else 1)
            self.rate = recent if self.rate == 0 else 0.8 * self.rate + 0.2 * recent
        self.on_batch(len(batch.items), seconds)
        for item, outcome in zip(batch.items, outcomes):
            ticket = item.ticket
            if ticket.future.done() or isinstance(outcome, Cancelled):
                continue
            if isinstance(outcome, Exception):
                ticket.future.set_exception(outcome)
                self.cancel(ticket, outcome)  # its other lines are not decoded for nothing
                continue
            ticket.results[item.index] = outcome
            ticket.left -= 1
            if ticket.left == 0:
                ticket.future.set_result(ticket.results)
        del self.running[lane]
        self.wake.set()

    # --- the lane's thread ---

    def _isolated(self, lane: int, batch: Running) -> list[Any]:
        """`work` on the batch; if it fails and the batch holds several requests, each request's lines again alone,
        so that only the request at fault gets the error."""
        started = time.thread_time()
        key = batch.items[0].ticket.key
        try:
            try:
                return self.work(lane, key, [item.payload for item in batch.items], batch.cancel)
            except Cancelled:
                return [Cancelled()] * len(batch.items)
            except Exception as err:
                tickets = list(dict.fromkeys(item.ticket for item in batch.items))
                if len(tickets) == 1:
                    return [err] * len(batch.items)
            outcomes: dict[int, Any] = {}
            for ticket in tickets:
                mine = [item for item in batch.items if item.ticket is ticket]
                try:
                    results = self.work(lane, key, [item.payload for item in mine], batch.cancel)
                except Exception as err:  # Cancelled included
                    results = [err] * len(mine)
                outcomes.update(zip(map(id, mine), results))
            return [outcomes[id(item)] for item in batch.items]
        finally:
            self.busy_cpu += time.thread_time() - started
