"""nmt-serve checkpoint=PATH [compare=PATH] [host=127.0.0.1] [port=8000]: an HTTP API and an attention page."""

from __future__ import annotations

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

Load the model(s) once and serve, until Ctrl-C:
  POST /v1/translate  {"text": ["...", ...], "beam": 5, "nbest": 1, "attention": false, "model": "a"}
  GET  /v1/models     name, architecture, attention variant, parameters, vocabularies, training steps
  GET  /health        for a load balancer
  GET  /              a page with the translation, the n-best list and an interactive attention heat map;
                      with compare=PATH, both models side by side (model "a" is checkpoint, "b" is compare)
Concurrent requests are decoded together (the first waits up to serve.max_wait_ms for others).
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


def serve(cfg: ServeConfig) -> None:
    """Load the models, bind the socket, and run the app until interrupted."""
    try:
        import uvicorn

        from nmt.serve.app import create_app
        from nmt.serve.models import load_model
    except ImportError as err:
        raise NmtError(
            f"nmt-serve needs the serve extra ({err.name} is missing): pip install 'nmt-attention[serve]'"
        ) from None
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    device = resolve_device(cfg.device, key="device")
    paths = {"a": cfg.checkpoint} | ({"b": cfg.compare} if cfg.compare else {})
    models = [load_model(name, path, cfg.decode, device) for name, path in paths.items()]
    app = create_app(models, cfg.serve, cfg.decode)
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
    config = uvicorn.Config(
        app, log_level="info" if cfg.serve.access_log else "warning", access_log=cfg.serve.access_log
    )
    try:
        uvicorn.Server(config).run(sockets=[sock])
    except KeyboardInterrupt:  # uvicorn shuts down gracefully on Ctrl-C, then raises it again
        pass
    print("nmt-serve: stopped", flush=True)


def main(argv: list[str]) -> int | None:
    if "-h" in argv or "--help" in argv:
        return print_help(USAGE)
    serve(compose("serve", argv))


def entry() -> None:
    run(main)


if __name__ == "__main__":
    entry()
