"""POST /v1/translate/stream: translations sent as Server-Sent Events while they are decoded.

The body is /v1/translate's, checked the same way (nmt.serve.requests; `finished_only` too; nbest > 1, constraints
and avoid refused with 422). A request refused before its stream starts (4xx, 503 overloaded) gets the same JSON
error with its status code. Then the answer is 200 `text/event-stream`, events separated by a blank line:

    data: {"line": 0, "step": 1, "tokens": [...], "text": "...", "keep": 0, "finished": false,
           "attention": [[...], ...], "src": [...]}                 after each decoding step of a line
    data: {"line": 0, "final": true, "result": {...}}              the line's result: /v1/translate's translations[i]
    event: done
    data: {"model": {...}, "decode": "...", "warnings": [...]}      the end
    event: error
    data: {"error": "...", "field": null, "status": 504}          the end, when the stream cannot go on

A step event shows the hypothesis of nmt.streaming (the output so far; the top of the beam) with the tokens and
text so far; `keep` is how many of its output steps stand from the line's previous event; `attention` holds its
rows from `keep` on (lines that asked for attention; `src`, the source pieces, comes in the line's first event).

Scheduling: the lines are decoded one after another, each a ticket of its own, submitted when the line before it
has been decoded, that takes its turn in the scheduler's queue and runs alone on a lane (a "solo" batch). The lane
hands each step's event over as it is made and never waits for the client: a client that reads slowly holds no
lane, only this request's queue (at most one line's events). Deadlines: the request's decoding must end within
serve.timeout_s of its arrival, else its search stops at the next step and the stream ends with an error event
(504); a write the client does not take within serve.timeout_s ends the request and closes the connection. A client
that disconnects has its line's search stopped at its next step, and nothing more decoded.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass
from typing import Any

from starlette.concurrency import run_in_threadpool

from nmt.serve.lanes import StreamJob, StreamKey
from nmt.serve.metrics import Metrics
from nmt.serve.models import ServedModel
from nmt.serve.requests import TranslateRequest
from nmt.serve.scheduler import Cancelled, Overloaded, Scheduler, Ticket

log = logging.getLogger("nmt.serve")

HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-store"),
    (b"x-accel-buffering", b"no"),  # a proxy in front (nginx) passes each event on as it comes
]


def sse(data: dict[str, Any], event: str | None = None) -> bytes:
    """One Server-Sent Event: compact JSON on one `data:` line (JSON text holds no raw newline)."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return (f"event: {event}\n" if event else "").encode() + b"data: " + text.encode("utf-8") + b"\n\n"


class Stalled(Exception):
    """The client took no bytes for serve.timeout_s."""


@dataclass
class Line:
    """A line being decoded: its ticket and the queue its step events arrive in (lists of records)."""

    ticket: Ticket
    events: asyncio.Queue


@dataclass
class StreamedRequest:
    """A checked stream request and what encoding its lines gave."""

    job: TranslateRequest
    model: ServedModel
    ids: list[list[int]]
    options: list[tuple]
    warnings: list[str]
    decode: str  # the search settings, as /v1/translate's "decode"
    arrived: float  # time.monotonic() at its arrival


class EventStream:
    """The ASGI response of one stream request (see the module's docstring)."""

    def __init__(
        self, scheduler: Scheduler, request: StreamedRequest, timeout_s: float, metrics: Metrics, record: dict
    ):
        """record: the request's access-log fields (its outcome is added)."""
        self.scheduler = scheduler
        self.request = request
        self.timeout_s = timeout_s
        self.metrics = metrics
        self.record = record
        self.deadline = request.arrived + timeout_s  # of the decoding (time.monotonic)
        self.pending: dict[int, Line] = {}  # the lines submitted

    def submit(self, i: int) -> Line:
        """Queue line i (raises Overloaded); its events go to its queue from the lane's thread."""
        r = self.request
        loop, events = asyncio.get_running_loop(), asyncio.Queue()
        emit = lambda record: loop.call_soon_threadsafe(events.put_nowait, record)  # noqa: E731
        payload = (r.ids[i], r.options[i][0], i in r.job.attention, r.job.finished_only)
        cost = (len(r.ids[i]) + 1) * r.job.beam
        key = StreamKey(r.job.model, r.job.beam)
        ticket = self.scheduler.submit(key, [StreamJob(payload, emit)], [cost], solo=True)
        self.pending[i] = Line(ticket, events)
        return self.pending[i]

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        gone = asyncio.ensure_future(disconnected(receive))
        outcome = "done"
        try:
            await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
            outcome = await self.lines(send, gone)
            if outcome == "done":
                r = self.request
                await self.write(send, sse({"model": r.model.info, "decode": r.decode, "warnings": r.warnings}, "done"))
            if outcome != "disconnected":
                await asyncio.wait_for(send({"type": "http.response.body", "body": b""}), self.timeout_s)
        except (Stalled, asyncio.TimeoutError):
            outcome = "stalled"  # the connection is closed without the end of the stream
            log.info("stream: the client took nothing for serve.timeout_s=%g seconds; closed", self.timeout_s)
        finally:
            gone.cancel()
            for line in self.pending.values():
                if not line.ticket.future.done():
                    self.scheduler.cancel(line.ticket)
            self.metrics.stream(outcome)
            self.record["outcome"] = outcome

    async def lines(self, send: Any, gone: asyncio.Future) -> str:
        """Every line's events in order; how the stream ended ("done", "disconnected", "timeout", "error")."""
        r = self.request
        for i, text in enumerate(r.job.lines):
            if not text.strip():  # no search: its result at once, as /v1/translate gives it
                await self.write(send, sse({"line": i, "final": True, "result": await self.result(i, [[]])}))
                continue
            try:
                line = self.pending.get(i) or self.submit(i)
            except Overloaded as err:  # a later line found the queue full
                await self.error(send, 503, str(err))
                return "error"
            outcome = await self.decode(i, line, send, gone)
            if outcome != "done":
                return outcome
        return "done"

    async def decode(self, i: int, line: Line, send: Any, gone: asyncio.Future) -> str:
        """Line i's step events as they come, then its result."""
        while True:
            if gone.done():
                return "disconnected"
            if not line.events.empty():
                await self.steps(send, i, line.events.get_nowait())
                continue
            if line.ticket.future.done():
                break
            getter = asyncio.ensure_future(line.events.get())
            left = max(self.deadline - time.monotonic(), 0)
            done, _ = await asyncio.wait(
                {getter, line.ticket.future, gone}, timeout=left, return_when="FIRST_COMPLETED"
            )
            if getter in done:
                await self.steps(send, i, getter.result())
                continue
            getter.cancel()
            if gone in done:
                return "disconnected"
            if not done:
                self.scheduler.cancel(line.ticket, TimeoutError())
                seconds = f"{self.timeout_s:g}"
                await self.error(
                    send, 504, f"not answered within serve.timeout_s={seconds} seconds; its work was dropped"
                )
                return "timeout"
        try:
            found = line.ticket.future.result()
        except Cancelled:
            await self.error(send, 503, "the server is shutting down")
            return "error"
        except Exception as err:  # noqa: BLE001 - the log has it; the client gets one line
            log.error(
                "decoding failed (model %s, beam %d): %s: %s",
                self.request.job.model,
                self.request.job.beam,
                type(err).__name__,
                err,
            )
            await self.error(send, 500, "decoding failed (the server's log has the details)")
            return "error"
        await self.write(send, sse({"line": i, "final": True, "result": await self.result(i, found)}))
        return "done"

    async def result(self, i: int, found: list[Any]) -> dict[str, Any]:
        """Line i's result from its hypotheses ([[]] for a blank line), as /v1/translate's translations[i]."""
        r = self.request
        wanted = frozenset({0}) if i in r.job.attention else frozenset()
        return (await run_in_threadpool(r.model.results, [r.ids[i]], found, wanted, r.job.alignments))[0]

    async def steps(self, send: Any, i: int, records: list[dict[str, Any]]) -> None:
        """Line i's step records, handed over together by the lane, in one write."""
        await self.write(send, b"".join(sse({"line": i} | record) for record in records))
        self.metrics.stream_events.inc(len(records))

    async def error(self, send: Any, status: int, message: str) -> None:
        await self.write(send, sse({"error": message, "field": None, "status": status}, "error"))

    async def write(self, send: Any, chunk: bytes) -> None:
        """Send a chunk; Stalled if the client does not take it within serve.timeout_s."""
        try:
            await asyncio.wait_for(
                send({"type": "http.response.body", "body": chunk, "more_body": True}), self.timeout_s
            )
        except asyncio.TimeoutError:
            raise Stalled() from None


async def disconnected(receive: Any) -> None:
    """Returns when the client has gone away (its body already read, the next message is the disconnect)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
