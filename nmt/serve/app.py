"""The HTTP app (Starlette): the translation API, the model list, health, metrics and the attention page.

    POST /v1/translate   {"text": [...], "beam", "nbest", "attention", "model"} -> one result per line
    POST /v1/translate/stream   the same body -> Server-Sent Events: each line's output after every decoding
                         step, then its result (nmt.serve.streams)
    GET  /v1/models      each model's name, label, arch, attention variant, size, vocabularies, training steps
    GET  /health         "ok", with the lines waiting, the batches running, and the work done so far
    GET  /metrics        the same and more in the Prometheus text format (nmt.serve.metrics)
    GET  /               the page (static/index.html, style.css, app.js)

Every answer is JSON (but the page, its files and /metrics), every error an object {"error": "...", "field": ...}
that names the field at fault: 4xx for the client's mistakes (requests.py), 400 for a Host header the server does
not answer to (serve.allowed_hosts: a page elsewhere cannot reach a loopback server through DNS rebinding), 503 with
Retry-After when serve.max_requests requests are in hand or serve.max_queue_lines lines wait, 504 when a request is
not answered within serve.timeout_s, 500 when decoding fails. No error body holds an exception's text or a path of
this host (the server's log has the details), and one request's failure never reaches another's response
(nmt.serve.scheduler). A client that disconnects has its waiting work dropped and its running search stopped.
Responses are encoded off the event loop, so a large one (attention for long lines) does not stall the others.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from contextlib import asynccontextmanager, suppress
from dataclasses import replace
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from nmt.config import DecodeConfig, ServeSettings
from nmt.serve.lanes import ProcessLanes, ThreadLanes
from nmt.serve.metrics import Metrics
from nmt.serve.models import ServedModel
from nmt.serve.requests import RequestError, check_content_type, parse_request
from nmt.serve.scheduler import Cancelled, Overloaded, Scheduler
from nmt.serve.streams import EventStream, StreamedRequest
from nmt.translation import decode_settings

STATIC = Path(__file__).parent / "static"
log = logging.getLogger("nmt.serve")
access = logging.getLogger("nmt.serve.access")

SECURITY_HEADERS = [
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (b"cross-origin-resource-policy", b"same-origin"),
    (
        b"content-security-policy",
        b"default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
        b"frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
    ),
]
ROUTES = ("/v1/translate", "/v1/translate/stream", "/v1/models", "/health", "/metrics", "/")


def body_limit(settings: ServeSettings) -> int:
    """Bytes a request body may hold: serve.max_chars characters, JSON-escaped, and room for the rest."""
    return 6 * settings.max_chars + 64 * settings.max_lines + 4096


async def read_body(request: Request, limit: int) -> bytes:
    """The body, refused with 413 as soon as it passes `limit` bytes (it is never held whole beyond that)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise RequestError(413, "text", f"the body is {declared} bytes; at most {limit} (serve.max_chars sets it)")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise RequestError(413, "text", f"the body is over {limit} bytes (serve.max_chars sets it)")
        chunks.append(chunk)
    return b"".join(chunks)


def host_name(header: str) -> str:
    """The name of a Host header without its port: "[::1]:8000" -> "::1", "Example.org:80" -> "example.org"."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1 : header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def error_json(status: int, field: str | None, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message, "field": field}, status_code=status, headers=headers)


class Guard:
    """ASGI middleware around the app: the Host allow-list, the bound on requests in hand, security headers on
    every response, one JSON access-log line and the metrics per request, and a JSON 500 (never a traceback in a
    body) for anything that escapes a handler."""

    def __init__(self, app: Any, settings: ServeSettings, metrics_of: Any):
        self.app, self.settings, self.metrics_of = app, settings, metrics_of
        self.allowed = {name.lower() for name in settings.allowed_hosts}
        self.in_flight = 0

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = time.perf_counter()
        status = {"code": 500}

        async def guarded_send(message: dict) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
                message["headers"] = [*message.get("headers", []), *SECURITY_HEADERS]
            await send(message)

        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        host = host_name(headers.get("host", ""))
        answer: JSONResponse | None = None
        if "*" not in self.allowed and host not in self.allowed:
            shown = json.dumps(host[:80])
            answer = error_json(400, "host", f"Host {shown}: not a name this server answers to (serve.allowed_hosts)")
        elif self.in_flight >= self.settings.max_requests:
            answer = error_json(
                503,
                None,
                f"{self.in_flight} requests in hand (serve.max_requests={self.settings.max_requests}); retry later",
                {"Retry-After": "1"},
            )
        self.in_flight += 1
        try:
            if answer is not None:
                await answer(scope, receive, guarded_send)
            else:
                await self.app(scope, receive, guarded_send)
        except Exception:
            log.exception("%s %s failed", scope.get("method"), scope.get("path"))
            if status["code"] == 500:  # nothing was sent yet (or the 500 itself)
                with suppress(Exception):
                    await error_json(500, None, "internal error (the server's log has the details)")(
                        scope, receive, guarded_send
                    )
        finally:
            self.in_flight -= 1
            seconds = time.perf_counter() - started
            path = scope.get("path", "")
            route = path if path in ROUTES else ("/static" if path.startswith("/static/") else "other")
            metrics = self.metrics_of()
            if metrics is not None:
                metrics.request(route, status["code"], seconds)
            if self.settings.access_log:
                client = scope.get("client") or ("", 0)
                access.info(
                    json.dumps(
                        {
                            "time": round(time.time(), 3),
                            "client": f"{client[0]}:{client[1]}",
                            "method": scope.get("method"),
                            "path": route,
                            "status": status["code"],
                            "ms": round(seconds * 1000, 1),
                            **scope.get("nmt.log", {}),
                        }
                    )
                )


async def disconnected(request: Request) -> None:
    """Returns when the client has gone away (its body already read, the next message is the disconnect)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def create_app(
    models: list[ServedModel],
    settings: ServeSettings,
    decode: DecodeConfig,
    checkpoints: dict[str, str] | None = None,
    threads: int | None = None,
    device: str = "cpu",
) -> Starlette:
    """The app serving `models` (named "a", "b"); decode holds the default search settings. With serve.workers > 1
    the searches run in that many processes, each loading `checkpoints` (name -> path) on `device`."""
    by_name = {m.name: m for m in models}
    beams = {m.name: min(settings.max_beam, m.widest_beam) for m in models}
    limit = body_limit(settings)
    threads_lanes = ThreadLanes({m.name: m.translator for m in models})
    lanes: dict[str, Any] = {"processes": None}

    def work(lane: int, key: Any, src_ids: list[Any], cancel: Any) -> list[Any]:
        processes = lanes["processes"]
        if processes is not None and lane < settings.workers:
            return processes(lane, key, src_ids, cancel)
        return threads_lanes(lane, key, src_ids, cancel)

    scheduler = Scheduler(
        work,
        settings.workers,
        settings.max_wait_ms / 1000,
        settings.max_batch_lines,
        decode.batch_tokens,
        settings.long_tokens,
        settings.max_queue_lines,
    )
    metrics = Metrics(lambda: scheduler.waiting_lines, lambda: len(scheduler.running), lambda: guard.in_flight)
    scheduler.on_batch = metrics.batch

    async def translate(request: Request) -> Response:
        arrived = time.monotonic()
        try:
            check_content_type(request.headers.get("content-type"))
            body = await read_body(request, limit)
            job = await run_in_threadpool(parse_request, body, settings, beams, decode.beam, decode.nbest)
        except RequestError as err:
            return JSONResponse(err.body(), status_code=err.status)
        model = by_name[job.model]
        ids, options, warnings = await run_in_threadpool(
            model.encode, list(job.lines), job.prefixes, job.constraints, job.avoid
        )
        filled = [i for i, line in enumerate(job.lines) if line.strip()]
        request.scope["nmt.log"] = {"model": job.model, "lines": len(job.lines), "beam": job.beam}
        width = job.beam
        try:
            ticket = scheduler.submit(
                (job.model, job.beam, job.nbest),
                [(ids[i], *options[i]) for i in filled],
                [(len(ids[i]) + 1) * width for i in filled],
            )
        except Overloaded as err:
            return error_json(503, None, str(err), {"Retry-After": str(err.retry_after)})
        gone = asyncio.ensure_future(disconnected(request))
        left = settings.timeout_s - (time.monotonic() - arrived)
        try:
            done, _ = await asyncio.wait({ticket.future, gone}, timeout=max(left, 0), return_when="FIRST_COMPLETED")
        finally:
            gone.cancel()
        if ticket.future not in done:
            if gone in done:
                scheduler.cancel(ticket)
                request.scope["nmt.log"]["disconnected"] = True
                return error_json(499, None, "the client went away")  # nobody reads it
            scheduler.cancel(ticket, TimeoutError())
            return error_json(
                504,
                None,
                f"not answered within serve.timeout_s={settings.timeout_s:g} seconds; the request's work was dropped",
            )
        try:
            found = ticket.future.result()
        except Cancelled:
            return error_json(503, None, "the server is shutting down", {"Retry-After": "5"})
        except Exception as err:
            log.error("decoding failed (model %s, beam %d): %s: %s", job.model, job.beam, type(err).__name__, err)
            return error_json(500, None, "decoding failed (the server's log has the details)")
        hyps: list[list[Any]] = [[] for _ in job.lines]
        for i, h in zip(filled, found):
            hyps[i] = h

        def respond() -> bytes:
            payload = {
                "translations": model.results(ids, hyps, job.attention, job.alignments),
                "model": model.info,
                "decode": decode_settings(replace(decode, beam=job.beam, nbest=job.nbest)),
                "warnings": warnings,
            }
            return json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode("utf-8")

        return Response(await run_in_threadpool(respond), media_type="application/json")

    async def translate_stream(request: Request) -> Any:
        arrived = time.monotonic()
        try:
            check_content_type(request.headers.get("content-type"))
            body = await read_body(request, limit)
            job = await run_in_threadpool(parse_request, body, settings, beams, decode.beam, 1, True)
        except RequestError as err:
            return JSONResponse(err.body(), status_code=err.status)
        model = by_name[job.model]
        ids, options, warnings = await run_in_threadpool(model.encode, list(job.lines), job.prefixes)
        record = {"model": job.model, "lines": len(job.lines), "beam": job.beam, "stream": True}
        request.scope["nmt.log"] = record
        settings_text = decode_settings(replace(decode, beam=job.beam, nbest=1))
        streamed = StreamedRequest(job, model, ids, options, warnings, settings_text, arrived)
        stream = EventStream(scheduler, streamed, settings.timeout_s, metrics, record)
        first = next((i for i, line in enumerate(job.lines) if line.strip()), None)
        if first is not None:
            try:
                stream.submit(first)  # a full queue is a 503 before the stream starts
            except Overloaded as err:
                return error_json(503, None, str(err), {"Retry-After": str(err.retry_after)})
        return stream

    async def list_models(request: Request) -> JSONResponse:
        return JSONResponse(
            {
                "models": [m.info | {"max_beam": beams[m.name]} for m in models],
                "limits": {"max_lines": settings.max_lines, "max_chars": settings.max_chars},
                "decode": {"beam": decode.beam, "nbest": decode.nbest, "settings": decode_settings(decode)},
            }
        )

    async def health(request: Request) -> JSONResponse:
        counts = {
            "queued": scheduler.waiting_lines,
            "running": len(scheduler.running),
            "batches": scheduler.batches,
            "requests": scheduler.jobs,
            "lines": scheduler.lines,
            "workers": settings.workers,
            "decode_s": round(scheduler.busy, 3),
            "decode_cpu_s": round(scheduler.busy_cpu, 3),
        }
        return JSONResponse({"status": "ok", "models": list(by_name)} | counts)

    async def metrics_page(request: Request) -> Response:
        body, kind = metrics.text()
        return Response(body, media_type=kind.split(";")[0], headers={"content-type": kind})

    async def page(request: Request) -> FileResponse:
        return FileResponse(STATIC / "index.html")

    async def http_error(request: Request, err: Exception) -> JSONResponse:
        assert isinstance(err, HTTPException)
        return error_json(err.status_code, None, f"{request.method} {request.url.path[:200]}: {err.detail}")

    @asynccontextmanager
    async def lifespan(app: Starlette):
        if settings.workers > 1:
            names = checkpoints or {m.name: m.checkpoint for m in models}
            lanes["processes"] = await run_in_threadpool(ProcessLanes, names, decode, device, threads, settings.workers)
        scheduler.start()
        try:
            yield
        finally:
            await scheduler.stop()
            if lanes["processes"] is not None:
                lanes["processes"].close()
                lanes["processes"] = None

    routes = [
        Route("/v1/translate", translate, methods=["POST"]),
        Route("/v1/translate/stream", translate_stream, methods=["POST"]),
        Route("/v1/models", list_models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics_page, methods=["GET"]),
        Route("/", page, methods=["GET"]),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={HTTPException: http_error})
    app.state.scheduler = scheduler
    app.state.metrics = metrics
    guard = Guard(app, settings, lambda: metrics)
    guard.state = app.state  # type: ignore[attr-defined]
    return guard  # type: ignore[return-value]
