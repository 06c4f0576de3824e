"""nmt-serve checkpoint=PATH [compare=PATH] [host=127.0.0.1] [port=8000]: an HTTP API and an attention page."""

from __future__ import annotations

import signal
import socket
import sys

import torch

from nmt.cli.common import compose, print_help, run
from nmt.config import ServeConfig
from nmt.errors import NmtError
from nmt.runtime import resolve_device

USAGE = """
usage: nmt-serve checkpoint=PATH [compare=PATH] [host=127.0.0.1] [port=8000] [decode=greedy|beam] [decode.KEY=VALUE ...]
                 [serve.max_lines=N] [serve.max_chars=N] [serve.max_beam=N] [serve.max_wait_ms=MS] [serve.max_batch_lines=N]
                 [serve.workers=N] [serve.timeout_s=S] [serve.max_queue_lines=N] [serve.max_requests=N]
                 [serve.allowed_hosts=[NAME,...]] [serve.shutdown_s=S] [serve.long_tokens=N] [serve.access_log=BOOL]

Load the model(s) once and serve, until Ctrl-C:
  POST /v1/translate  {"text": ["...", ...], "beam": 5, "nbest": 1, "attention": false, "model": "a"}
  POST /v1/translate/stream  the same body; Server-Sent Events: each line's output after every decoding step
  GET  /v1/models     name, architecture, attention variant, parameters, vocabularies, training steps
  GET  /health        for a load balancer
  GET  /              a page with the translation, the n-best list and an interactive attention heat map;
                      with compare=PATH, both models side by side (model "a" is checkpoint, "b" is compare)
Concurrent requests are decoded together (the first waits up to serve.max_wait_ms for others), fairly: a long
request never holds a short one. Overload gets 503 with Retry-After, a request past serve.timeout_s gets 504,
a client that leaves has its work dropped; serve.workers=N searches in N processes (one per core).
Only Host names in serve.allowed_hosts are answered (loopback names by default); SIGTERM or Ctrl-C lets
in-flight requests finish for up to serve.shutdown_s seconds.
It listens on 127.0.0.1 only unless host= says otherwise; port=0 takes any free port. Examples:
  nmt-serve checkpoint=runs/quickstart
  nmt-serve checkpoint=runs/transformer compare=runs/luong decode=beam port=8080
  curl -s localhost:8000/v1/translate -H 'content-type: application/json' -d '{"text": ["ze bosize dibope"]}'
"""  # noqa: E501 (--help prints this text verbatim; wrapping it would change the output)

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def listen(host: str, port: int) -> socket.socket:
    """A listening socket, so that a used port is a one-line error and port=0 shows the port it got."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as err:
        raise NmtError(f"host={host}: not an address of this machine ({err.strerror})") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
        sock.listen(2048)
    except OSError as err:
        sock.close()
        raise NmtError(f"host={host} port={port}: cannot listen there ({err.strerror or err})") from None
    return sock


def uvicorn_config(app, settings):
    """How uvicorn runs the app: no access log of its own (the app writes one JSON line per request), shutdown
    bounded by serve.shutdown_s, sockets bounded above serve.max_requests (the app answers JSON 503s first), idle
    keep-alive connections closed after 5 s, and no Server banner."""
    import uvicorn

    return uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=settings.shutdown_s,
        limit_concurrency=settings.max_requests + 64,
        timeout_keep_alive=5,
        server_header=False,
    )


def configure_logging() -> None:
    """The server's own log lines on stderr: access lines as JSON, the rest prefixed "nmt-serve:"."""
    import logging

    for name, form in (("nmt.serve.access", "%(message)s"), ("nmt.serve", "nmt-serve: %(levelname)s: %(message)s")):
        logger = logging.getLogger(name)
        if not logger.handlers:
            handler = logging.StreamHandler(sys.stderr)
            handler.setFormatter(logging.Formatter(form))
            logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False


def serve(cfg: ServeConfig) -> None:
    """Load the models, bind the socket, and run the app until interrupted."""
    try:
        import uvicorn

        from nmt.serve.app import create_app
        from nmt.serve.models import load_model
    except ImportError as err:
        raise NmtError(
            f"nmt-serve needs the serve extra ({err.name} is missing): pip install -e '.[serve]' in the nmt clone"
        ) from None
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    device = resolve_device(cfg.device, key="device")
    paths = {"a": cfg.checkpoint} | ({"b": cfg.compare} if cfg.compare else {})
    models = [load_model(name, path, cfg.decode, device) for name, path in paths.items()]
    configure_logging()
    app = create_app(models, cfg.serve, cfg.decode, paths, cfg.threads, str(device))
    sock = listen(cfg.host, cfg.port)
    for m in models:
        print(f"nmt-serve: model {m.name}: {m.checkpoint} ({m.info['title']}, {m.steps} steps)", flush=True)
    host, port = sock.getsockname()[:2]
    where = f"[{host}]" if ":" in host else host
    print(f"nmt-serve: serving http://{where}:{port}/ (Ctrl-C stops)", flush=True)
    if cfg.host not in LOOPBACK:
        print(
            f"nmt-serve: warning: host={cfg.host} accepts connections from other machines; there is no authentication",
            file=sys.stderr,
        )
        if "*" not in cfg.serve.allowed_hosts:
            print(
                f"nmt-serve: clients must send a Host name in serve.allowed_hosts={list(cfg.serve.allowed_hosts)}; "
                "add the names they use (or *)",
                file=sys.stderr,
            )
    config = uvicorn_config(app, cfg.serve)
    # uvicorn shuts down gracefully on SIGTERM or Ctrl-C (in-flight requests get serve.shutdown_s), then raises the
    # signal again for the handler it found: this one, so that a stop on purpose is a clean exit.
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)
    try:
        uvicorn.Server(config).run(sockets=[sock])
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
    print("nmt-serve: stopped", flush=True)


def main(argv: list[str]) -> int | None:
    if "-h" in argv or "--help" in argv:
        return print_help(USAGE)
    serve(compose("serve", argv))


def entry() -> None:
    run(main)


if __name__ == "__main__":
    entry()
