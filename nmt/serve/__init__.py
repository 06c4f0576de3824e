"""nmt-serve: trained models behind an HTTP API, and a page that shows their attention.

    models.py     a loaded checkpoint: its description (label, arch, attention variant, size, steps), its
                  lines encoded, and hypotheses turned into JSON-ready results (n-best, scores, attention)
    requests.py   the JSON body of POST /v1/translate checked field by field (4xx errors name the field)
    scheduler.py  concurrent requests' lines batched fairly onto lanes, with deadlines, cancellation, a bound
    lanes.py      where searches run: threads of the server, or serve.workers processes; stoppable per step
    streams.py    POST /v1/translate/stream: a request's lines as Server-Sent Events while they are decoded
    metrics.py    GET /metrics in the Prometheus format
    app.py        the Starlette app: /v1/translate (and /stream), /v1/models, /health, /metrics, the page at /, and
                  the guard (Host allow-list, security headers, request bound, JSON errors, access log)
    static/       the page: plain HTML, CSS and JavaScript, served as they are (no build step, no CDN)

The command is nmt/cli/serve.py (`nmt-serve checkpoint=RUN [compare=RUN]`).
"""
