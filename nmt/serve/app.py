"""The HTTP app (Starlette): the translation API, the model list, a health check and the attention page.

    POST /v1/translate   {"text": [...], "beam", "nbest", "attention", "model"} -> one result per line
    GET  /v1/models      each model's name, arch, attention variant, size, vocabularies, training steps
    GET  /health         "ok", with the queue length, the batches and requests decoded, and the seconds (and CPU
                         seconds) spent decoding
    GET  /               the page (static/index.html, style.css, app.js)

Every error is a JSON object {"error": "...", "field": ...}: 4xx for the client's mistakes (see
requests.py), 500 when decoding fails; the server goes on serving either way.
"""

from __future__ import annotations

import logging
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from nmt.config import DecodeConfig, ServeSettings
from nmt.serve.batcher import Batcher
from nmt.serve.models import ServedModel
from nmt.serve.requests import RequestError, TranslateRequest, parse_request
from nmt.translation import decode_settings

STATIC = Path(__file__).parent / "static"
log = logging.getLogger("nmt.serve")


def decode_group(model: ServedModel, beam: int, nbest: int, jobs: list[TranslateRequest]) -> list[dict[str, Any]]:
    """Requests with the same model, beam and n-best size, decoded as one list of lines; one response each."""
    translator = model.searcher(beam, nbest)
    translations = translator.translate_lines([line for job in jobs for line in job.lines])
    responses, start = [], 0
    for job in jobs:
        part, start = translations[start : start + len(job.lines)], start + len(job.lines)
        responses.append(
            {
                "translations": model.results(translator, part, job.attention),
                "model": model.info,
                "decode": decode_settings(translator.decode),
                "warnings": model.source_warnings(list(job.lines)),
            }
        )
    return responses


def decode_jobs(models: dict[str, ServedModel], jobs: list[TranslateRequest]) -> list[dict[str, Any] | Exception]:
    """The worker thread's work: one response (or the exception that stopped its group) per request."""
    outcomes: list[dict[str, Any] | Exception] = [RuntimeError("not decoded")] * len(jobs)
    groups: dict[tuple[str, int, int], list[int]] = {}
    for i, job in enumerate(jobs):
        groups.setdefault((job.model, job.beam, job.nbest), []).append(i)
    for (name, beam, nbest), members in groups.items():
        try:
            for i, response in zip(members, decode_group(models[name], beam, nbest, [jobs[i] for i in members])):
                outcomes[i] = response
        except Exception as err:
            log.exception("decoding failed (model %s, beam %d, nbest %d, %d requests)", name, beam, nbest, len(members))
            for i in members:
                outcomes[i] = err
    return outcomes


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


def create_app(models: list[ServedModel], settings: ServeSettings, decode: DecodeConfig) -> Starlette:
    """The app serving `models` (named "a", "b"); decode holds the default search settings."""
    by_name = {m.name: m for m in models}
    beams = {m.name: min(settings.max_beam, m.widest_beam) for m in models}
    batcher = Batcher(lambda jobs: decode_jobs(by_name, jobs), settings.max_wait_ms / 1000, settings.max_batch_lines)
    limit = body_limit(settings)

    async def translate(request: Request) -> JSONResponse:
        try:
            job = parse_request(await read_body(request, limit), settings, beams, decode.beam, decode.nbest)
        except RequestError as err:
            return JSONResponse(err.body(), status_code=err.status)
        try:
            return JSONResponse(await batcher.submit(job, len(job.lines)))
        except Exception as err:
            return JSONResponse(
                {"error": f"decoding failed: {type(err).__name__}: {err}", "field": None}, status_code=500
            )

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
            "queued": len(batcher.pending),
            "batches": batcher.batches,
            "requests": batcher.jobs,
            "decode_s": round(batcher.busy, 3),
            "decode_cpu_s": round(batcher.busy_cpu, 3),
        }
        return JSONResponse({"status": "ok", "models": list(by_name)} | counts)

    async def page(request: Request) -> FileResponse:
        return FileResponse(STATIC / "index.html")

    async def http_error(request: Request, err: Exception) -> JSONResponse:
        assert isinstance(err, HTTPException)
        return JSONResponse(
            {"error": f"{request.method} {request.url.path}: {err.detail}", "field": None}, status_code=err.status_code
        )

    @asynccontextmanager
    async def lifespan(app: Starlette):
        batcher.start()
        yield
        await batcher.stop()

    routes = [
        Route("/v1/translate", translate, methods=["POST"]),
        Route("/v1/models", list_models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/", page, methods=["GET"]),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={HTTPException: http_error})
    app.state.batcher = batcher
    return app
